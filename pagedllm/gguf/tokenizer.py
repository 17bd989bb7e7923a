"""The Hugging Face fast tokenizer of a GGUF file, built from the vocabulary in its metadata."""

import os

from tokenizers import pre_tokenizers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from pagedllm.gguf.reader import read_gguf

# llama.cpp's pre-tokenizer type for SmolLM's tokenizer (see load_gguf_tokenizer)
_SMOLLM_PRE = "smollm"


def load_gguf_tokenizer(path: str) -> PreTrainedTokenizerBase:
    """The tokenizer transformers builds from the GGUF metadata (with its chat template), with
    SmolLM's digit splitting restored.

    Built by `PreTrainedTokenizerFast.from_pretrained(folder, gguf_file=...)`, not AutoTokenizer:
    for a GGUF both run the same conversion, but AutoTokenizer first re-reads the whole file with
    gguf.GGUFReader for a config it only uses to pick the class (~6 s against ~0.5 s here).

    SmolLM's own tokenizer.json splits every digit apart before the byte-level split; the GGUF
    conversion keeps only the byte-level one, so "\\n\\n1" would become ["\\n", "\\n", "1"]
    instead of ["\\n\\n", "1"]. llama.cpp marks that tokenizer with the pre-type "smollm".
    """
    gguf = read_gguf(path)
    if "tokenizer.ggml.tokens" not in gguf.metadata:
        raise ValueError(
            f"{path!r} holds no tokenizer (no tokenizer.ggml.* metadata); pass "
            "skip_tokenizer_init=True and give prompts as token ids"
        )
    folder, filename = os.path.split(os.path.abspath(path))
    tokenizer = PreTrainedTokenizerFast.from_pretrained(
        folder, gguf_file=filename, local_files_only=True
    )
    if gguf.metadata.get("tokenizer.ggml.pre") == _SMOLLM_PRE:
        tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    return tokenizer
