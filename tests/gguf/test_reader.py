"""pagedllm/gguf/reader.py: a missing, foreign or truncated file is named by every entry point
that reads a GGUF (config, tokenizer, weights); part of a stacked tensor reads as those rows of
the whole (reference: the whole tensor's read)."""

import pytest
import torch

from pagedllm.gguf.hf_config import load_gguf_config
from pagedllm.gguf.reader import narrow, read_blocks, read_gguf, read_tensor
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


def test_narrow_reads_a_stacked_tensors_rows_alone(tiny_files: dict) -> None:
    """Experts [1, 3) of a stacked [4, I, H] tensor read as a tensor of their own equal those
    rows of the whole tensor, as values and as stored bytes."""
    path, _, _ = tiny_files["qwen3moe"]
    gguf = read_gguf(path)
    info = gguf.tensors["blk.0.ffn_up_exps.weight"]
    part = narrow(info, 1, 2)
    assert part.shape == (2, *info.shape[1:]) and part.nbytes == info.nbytes // 2
    assert torch.equal(read_tensor(gguf, part), read_tensor(gguf, info)[1:3])
    assert torch.equal(read_blocks(gguf, part), read_blocks(gguf, info)[1:3])
