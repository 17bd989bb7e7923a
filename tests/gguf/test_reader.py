"""pagedllm/gguf/reader.py: a missing, foreign or truncated file is named by every entry point
that reads a GGUF (config, tokenizer, weights)."""

import pytest
import torch

from pagedllm.gguf.hf_config import load_gguf_config
from pagedllm.gguf.tensor_names import iterate_gguf_weights
from pagedllm.gguf.tokenizer import load_gguf_tokenizer


def test_missing_file_names_it(tmp_path) -> None:
    path = str(tmp_path / "nope.gguf")
    for load in (load_gguf_config, load_gguf_tokenizer):
        with pytest.raises(FileNotFoundError, match="nope.gguf"):
            load(path)
    with pytest.raises(FileNotFoundError, match="nope.gguf"):
        iterate_gguf_weights(path, torch.float32)


def test_non_gguf_file_names_it(tmp_path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "llama"}')
    with pytest.raises(ValueError, match="config.json is not a GGUF file"):
        load_gguf_config(str(path))
    with pytest.raises(ValueError, match="config.json is not a GGUF file"):
        iterate_gguf_weights(str(path), torch.float32)


@pytest.mark.parametrize("cut", [200, -100])  # inside the header, inside the tensor data
def test_truncated_file_names_it(tmp_path, tiny_files: dict, cut: int) -> None:
    source, _, _ = tiny_files["llama"]
    with open(source, "rb") as f:
        data = f.read()
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[:cut])
    with pytest.raises(ValueError, match="cut.gguf is truncated or corrupt"):
        iterate_gguf_weights(str(path), torch.float32)
