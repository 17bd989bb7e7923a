"""The Hugging Face fast tokenizer of a GGUF file, built from the vocabulary in its metadata."""

import json
import os

from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from pagedllm.gguf.reader import StringArray, read_gguf

# llama.cpp's pre-tokenizer type for SmolLM's tokenizer (see load_gguf_tokenizer)
_SMOLLM_PRE = "smollm"


def load_gguf_tokenizer(path: str) -> PreTrainedTokenizerBase:
    """The tokenizer transformers builds from the GGUF metadata (with its chat template), with
    SmolLM's digit splitting restored, no token beyond the file's list, and a sentencepiece
    vocabulary's space prefix as llama.cpp and the models' tokenizer.json add it.

    Built by `PreTrainedTokenizerFast.from_pretrained(folder, gguf_file=...)`, not AutoTokenizer:
    for a GGUF both run the same conversion, but AutoTokenizer first re-reads the whole file with
    gguf.GGUFReader for a config it only uses to pick the class (~6 s against ~0.5 s here).

    SmolLM's own tokenizer.json splits every digit apart before the byte-level split; the GGUF
    conversion keeps only the byte-level one, so "\\n\\n1" would become ["\\n", "\\n", "1"]
    instead of ["\\n\\n", "1"]. llama.cpp marks that tokenizer with the pre-type "smollm".
    """
    gguf = read_gguf(path)
    tokens = gguf.metadata.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, StringArray):
        raise ValueError(
            f"{path!r} holds no tokenizer (no tokenizer.ggml.* metadata); pass "
            "skip_tokenizer_init=True and give prompts as token ids"
        )
    folder, filename = os.path.split(os.path.abspath(path))
    tokenizer = PreTrainedTokenizerFast.from_pretrained(
        folder, gguf_file=filename, local_files_only=True
    )
    backend = _drop_tokens_past(tokenizer.backend_tokenizer, tokens.length)
    if gguf.metadata.get("tokenizer.ggml.model") == "llama":
        _prepend_space(backend, gguf.metadata.get("tokenizer.ggml.add_space_prefix", True))
    if gguf.metadata.get("tokenizer.ggml.pre") == _SMOLLM_PRE:
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    tokenizer._tokenizer = backend
    return tokenizer


def _drop_tokens_past(backend: Tokenizer, count: int) -> Tokenizer:
    """The backend without the tokens of id `count` and above. transformers' tokenizer classes
    add their default special tokens where the vocabulary lacks them (GPT2Tokenizer's
    `<|endoftext|>`, which Llama 3's vocabulary does not have), past the model's rows: text
    holding that string would encode to an id the model has no embedding for. llama.cpp has no
    such token and reads the string as plain text."""
    if backend.get_vocab_size(with_added_tokens=True) <= count:
        return backend
    spec = json.loads(backend.to_str())
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["id"] < count]
    vocab = spec["model"].get("vocab")
    if isinstance(vocab, dict):  # BPE / WordPiece: token -> id
        spec["model"]["vocab"] = {token: i for token, i in vocab.items() if i < count}
    return Tokenizer.from_str(json.dumps(spec))


def _prepend_space(backend: Tokenizer, add_space_prefix: bool) -> None:
    """A sentencepiece vocabulary as the models' tokenizer.json (and llama.cpp) read it: "▁"
    before the text where `add_space_prefix`, then every space as "▁". transformers'
    LlamaTokenizer prepends with Metaspace, which adds no "▁" to text that starts with a space,
    so " hi" would encode as "hi" does after its first piece and decode without its space."""
    prepend = [normalizers.Prepend("\u2581")] if add_space_prefix else []
    backend.normalizer = normalizers.Sequence([*prepend, normalizers.Replace(" ", "\u2581")])
    backend.pre_tokenizer = None
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    strip = [decoders.Strip(" ", 1, 0)] if add_space_prefix else []  # the prepended "▁"
    backend.decoder = decoders.Sequence(steps + strip)
