"""pagedllm/gguf/reader.py: a missing, foreign or truncated file is named by every entry point
that reads a GGUF (config, tokenizer, weights); part of a stacked tensor reads as those rows of
the whole (reference: the whole tensor's read); a header llama.cpp refuses (a repeated key or
tensor, an alignment that is not a power of two) is refused, and a split GGUF's shard is named."""

import re

import pytest
import torch
from gguf import GGUFValueType as VT

from pagedllm.gguf.hf_config import load_gguf_config
from pagedllm.gguf.reader import narrow, read_blocks, read_gguf, read_tensor
from pagedllm.gguf.tensor_names import iterate_gguf_weights
from pagedllm.gguf.tokenizer import load_gguf_tokenizer
from tests.gguf.tiny_gguf import write_tiny


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


@pytest.mark.parametrize(
    ("value", "shown"), [((0, VT.UINT32), "0"), ((3, VT.UINT32), "3"), (("x", VT.STRING), "'x'")]
)
def test_alignment_must_be_a_power_of_two(tmp_path, value: tuple, shown: str) -> None:
    """llama.cpp's rule (gguf.cpp: GGML_PAD needs a power of two)."""
    path = write_tiny(str(tmp_path / "align.gguf"), **{"general.alignment": value})
    message = f"align.gguf: metadata key 'general.alignment' is {shown}; it must be a power of two"
    with pytest.raises(ValueError, match=re.escape(message)):
        read_gguf(path)


def rename_once(path: str, old: bytes, new: bytes) -> None:
    """Rewrite the first `old` in the file as `new`, of the same length."""
    with open(path, "rb") as f:
        data = f.read()
    assert len(old) == len(new) and old in data
    with open(path, "wb") as f:
        f.write(data.replace(old, new, 1))


def test_a_repeated_metadata_key_is_refused(tmp_path) -> None:
    """Reference: llama.cpp's gguf_init and gguf.GGUFReader refuse a duplicated key."""
    path = write_tiny(
        str(tmp_path / "dup.gguf"), **{"test.key_a": (1, VT.UINT32), "test.key_b": (2, VT.UINT32)}
    )
    rename_once(path, b"test.key_b", b"test.key_a")
    with pytest.raises(ValueError, match="dup.gguf: metadata key 'test.key_a' appears twice"):
        read_gguf(path)


def test_a_repeated_tensor_name_is_refused(tmp_path) -> None:
    """Reference: llama.cpp's gguf_init and gguf.GGUFReader refuse a duplicated tensor name."""
    path = write_tiny(str(tmp_path / "dup.gguf"))
    rename_once(path, b"blk.0.attn_k.weight", b"blk.0.attn_q.weight")
    with pytest.raises(ValueError, match="dup.gguf: tensor 'blk.0.attn_q.weight' appears twice"):
        read_gguf(path)


def test_a_split_gguf_shard_says_to_merge(tmp_path) -> None:
    """llama-gguf-split's shards carry split.no (from 0) and split.count."""
    split = {"split.no": (0, VT.UINT16), "split.count": (2, VT.UINT16)}
    path = write_tiny(str(tmp_path / "m-00001-of-00002.gguf"), **split)
    message = "m-00001-of-00002.gguf is shard 1 of 2 of a split GGUF; merge the shards"
    for load in (load_gguf_config, load_gguf_tokenizer, read_gguf):
        with pytest.raises(ValueError, match=message + ".*llama-gguf-split --merge"):
            load(path)
