"""pagedllm/gguf/tokenizer.py on the default model (SmolLM2-135M-Instruct Q4_1), against
SmolLM2's own tokenizer.json and chat template; on tiny trained tokenizers of Llama 3's and
Llama 2's shapes (tests/gguf/tiny_tokenizers.py), against the HF tokenizers they came from.

(Not test_tokenizer.py: test files are imported by their base name, which must be unique.)
"""

import pytest

from pagedllm.gguf.reader import read_gguf
from pagedllm.gguf.tokenizer import load_gguf_tokenizer
from tests.gguf import tiny_tokenizers


def test_tokenizer_splits_every_digit_and_round_trips(tokenizer) -> None:
    text = "12345 apples cost 678.9"
    ids = tokenizer(text).input_ids
    digit_tokens = [t for t in tokenizer.convert_ids_to_tokens(ids) if any(c.isdigit() for c in t)]
    assert digit_tokens == list("12345") + list("6789")
    assert tokenizer.decode(ids) == text


def test_tokenizer_has_smollm2_digit_pre_tokenizer(tokenizer) -> None:
    """Reference: SmolLM2's tokenizer.json (Digits(individual_digits) then ByteLevel) splits
    "\\n\\n" from the digit before byte-level BPE, so "\\n\\n" is one token; transformers' GGUF
    conversion alone yields "\\n", "\\n"."""
    tokens = tokenizer.convert_ids_to_tokens(tokenizer("Steps:\n\n1. Mix").input_ids)
    assert tokens == ["Steps", ":", "ĊĊ", "1", ".", "ĠMix"]


def test_tokenizer_chat_template_from_gguf(tokenizer) -> None:
    messages = [{"role": "user", "content": "Hi there"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert "<|im_start|>user\nHi there<|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_a_file_without_a_tokenizer_says_so(tiny_files: dict) -> None:
    """The tiny files hold weights and no tokenizer.ggml.* metadata."""
    path = tiny_files["llama"][0]
    with pytest.raises(ValueError, match="holds no tokenizer.*skip_tokenizer_init=True"):
        load_gguf_tokenizer(path)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory):
    """kind -> (the GGUF file, the HF tokenizer it was converted from)."""
    files = {}
    for kind, train in (
        ("gpt2", tiny_tokenizers.byte_level),
        ("llama", tiny_tokenizers.sentencepiece),
    ):
        folder = tmp_path_factory.mktemp(f"{kind}_tokenizer")
        hf = train(folder)
        path = str(tmp_path_factory.mktemp(f"{kind}_gguf") / "model.gguf")
        tiny_tokenizers.write_tokenizer_gguf(path, folder, kind)
        files[kind] = (path, hf)
    path = str(tmp_path_factory.mktemp("gemma_gguf") / "model.gguf")
    tiny_tokenizers.write_tokenizer_gguf(path, folder, "llama", "gemma")
    files["gemma"] = (path, hf)
    return files


def test_byte_level_vocabulary_gains_no_endoftext(trained: dict) -> None:
    """Reference: the HF tokenizer the file came from (Llama 3's shape, no <|endoftext|>),
    which reads "<|endoftext|>" as plain text, as llama.cpp does; transformers' GPT2Tokenizer
    would add it as a special token past the model's rows."""
    path, hf = trained["gpt2"]
    tokenizer = load_gguf_tokenizer(path)
    assert len(tokenizer) == len(hf) == read_gguf(path).metadata["tokenizer.ggml.tokens"].length
    text = "one <|endoftext|> two"
    ids = tokenizer(text, add_special_tokens=False).input_ids
    assert ids == hf(text, add_special_tokens=False).input_ids
    assert max(ids) < len(hf) and tokenizer.decode(ids) == text


@pytest.mark.parametrize("text", [" leading space", "  two spaces", "no space"])
def test_sentencepiece_keeps_a_leading_space(trained: dict, text: str) -> None:
    """Reference: the source tokenizer.json's normalizer (Prepend "▁", spaces as "▁"), which
    llama.cpp's add_space_prefix matches: " x" is "▁▁x", and decodes back to " x"."""
    path, hf = trained["llama"]
    tokenizer = load_gguf_tokenizer(path)
    ids = tokenizer(text, add_special_tokens=False).input_ids
    normalized = hf.backend_tokenizer.normalizer.normalize_str(text)
    assert "".join(tokenizer.convert_ids_to_tokens(ids)) == normalized
    assert tokenizer.decode(ids) == text


@pytest.mark.parametrize("text", [" leading space", "two  words"])
def test_gemma_sentencepiece_adds_bos_and_no_space_prefix(trained: dict, text: str) -> None:
    """Reference: Gemma's tokenizer.json, whose normalizer only spells spaces "▁" (no prefix;
    the file's add_space_prefix is false), and its add_bos_token: "<s>" then the text."""
    path, hf = trained["gemma"]
    tokenizer = load_gguf_tokenizer(path)
    ids = tokenizer(text).input_ids
    tokens = tokenizer.convert_ids_to_tokens(ids)
    assert tokens[0] == hf.bos_token and "".join(tokens[1:]) == text.replace(" ", "\u2581")
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
