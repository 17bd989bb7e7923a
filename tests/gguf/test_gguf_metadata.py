"""pagedllm/gguf/metadata.py: a metadata value of the wrong type, zero or out of range is a
ValueError naming the file, the key and the value (reference: llama.cpp's loader, which
requires its key's type and refuses a file without heads), never a ZeroDivisionError nor
transformers' config validation error, and `pagedllm` exits 2 on it."""

import re

import pytest
import torch
from gguf import GGUFValueType as VT

from pagedllm.entrypoints.cli import main
from pagedllm.gguf.hf_config import load_gguf_config
from pagedllm.gguf.tensor_names import iterate_gguf_weights
from tests.gguf.tiny_gguf import write_tiny

BAD_VALUES = [
    ("llama.attention.head_count", (0, VT.UINT32), "0"),
    ("llama.attention.head_count_kv", (0, VT.UINT32), "0"),
    ("llama.attention.head_count_kv", ([2], VT.ARRAY, VT.UINT32), "array([2], dtype=uint32)"),
    ("llama.block_count", ("2", VT.STRING), "'2'"),
    ("llama.block_count", (True, VT.BOOL), "True"),
    ("llama.attention.layer_norm_rms_epsilon", ("1e-6", VT.STRING), "'1e-6'"),
    ("llama.attention.layer_norm_rms_epsilon", (0.0, VT.FLOAT32), "0.0"),
    ("llama.context_length", (0, VT.UINT32), "0"),
    ("llama.rope.freq_base", (-1.0, VT.FLOAT32), "-1.0"),
    ("tokenizer.ggml.eos_token_id", ("2", VT.STRING), "'2'"),
]


@pytest.mark.parametrize(("key", "value", "shown"), BAD_VALUES)
def test_a_bad_value_names_the_file_key_and_value(tmp_path, key: str, value, shown: str) -> None:
    path = write_tiny(str(tmp_path / "bad.gguf"), **{key: value})
    message = f"bad.gguf: metadata key '{key}' is {shown}; it must be"
    with pytest.raises(ValueError, match=re.escape(message)):
        load_gguf_config(path)


def test_zero_kv_heads_stop_the_weights_too(tmp_path) -> None:
    """The weights read the head counts themselves (llama's q/k permutation)."""
    path = write_tiny(
        str(tmp_path / "bad.gguf"), **{"llama.attention.head_count_kv": (0, VT.UINT32)}
    )
    with pytest.raises(ValueError, match="'llama.attention.head_count_kv' is 0"):
        list(iterate_gguf_weights(path, torch.float32))


def test_the_cli_exits_2_on_a_string_block_count(tmp_path, capsys) -> None:
    path = write_tiny(str(tmp_path / "bad.gguf"), **{"llama.block_count": ("2", VT.STRING)})
    with pytest.raises(SystemExit) as exit_info:
        main(["inspect", path])
    assert exit_info.value.code == 2
    assert "metadata key 'llama.block_count' is '2'" in capsys.readouterr().err
