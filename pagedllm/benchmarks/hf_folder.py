"""A GGUF model as a Hugging Face folder, cached, for peers that load only HF folders (vLLM's
CPU build has no GGUF path).

The folder holds the GGUF's weights dequantized to float32 (`model.safetensors`, as
transformers' `save_pretrained` writes them from the model hf_backend.py builds), its
config.json and generation_config.json, and the tokenizer of the file's vocabulary when it
has one. A peer casts the float32 weights to its own dtype at load.
"""

import json
import os
import shutil

from pagedllm.benchmarks.gguf_copy import cache_dir
from pagedllm.benchmarks.hf_backend import load_hf_model
from pagedllm.config import ModelConfig
from pagedllm.gguf.reader import read_gguf
from pagedllm.gguf.tokenizer import load_gguf_tokenizer

ADDED_TOKEN_FIELDS = ("content", "lstrip", "rstrip", "normalized", "single_word", "special")


def hf_folder_path(gguf_file: str) -> str:
    """The HF folder of `gguf_file`, written once into ~/.cache/pagedllm/STEM.hf (rewritten
    when the GGUF is newer)."""
    stem = os.path.splitext(os.path.basename(gguf_file))[0]
    target = os.path.join(cache_dir(), f"{stem}.hf")
    config = os.path.join(target, "config.json")
    if os.path.isfile(config) and os.path.getmtime(config) >= os.path.getmtime(gguf_file):
        return target
    partial = target + ".tmp"
    for folder in (partial, target):
        shutil.rmtree(folder, ignore_errors=True)
    write_hf_folder(gguf_file, partial)
    os.replace(partial, target)
    return target


def write_hf_folder(gguf_file: str, folder: str) -> None:
    model_config = ModelConfig.create(gguf_file, "float32", quantization="none")
    load_hf_model(model_config).save_pretrained(folder)
    if "tokenizer.ggml.tokens" in read_gguf(gguf_file).metadata:
        write_tokenizer(gguf_file, folder)


def write_tokenizer(gguf_file: str, folder: str) -> None:
    """The GGUF's tokenizer, saved by transformers, with its added tokens also listed in
    tokenizer_config.json (`added_tokens_decoder`), as Hub checkpoints carry them:
    transformers 5 saves the config without them and then, loading the folder, parses the
    whole tokenizer.json in Python to find them (0.27 s of every engine's start-up on the
    default model's 3.5 MB vocabulary; the whole load takes 0.15 s with the list)."""
    tokenizer = load_gguf_tokenizer(gguf_file)
    tokenizer.save_pretrained(folder)
    path = os.path.join(folder, "tokenizer_config.json")
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    config["added_tokens_decoder"] = {
        str(index): {field: getattr(token, field) for field in ADDED_TOKEN_FIELDS}
        for index, token in tokenizer.added_tokens_decoder.items()
    }
    with open(path, "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
