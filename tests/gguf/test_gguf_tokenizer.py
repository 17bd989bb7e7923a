"""pagedllm/gguf/tokenizer.py on the default model (SmolLM2-135M-Instruct Q4_1), against
SmolLM2's own tokenizer.json and chat template.

(Not test_tokenizer.py: test files are imported by their base name, which must be unique.)
"""

import pytest

from pagedllm.gguf.tokenizer import load_gguf_tokenizer


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
