"""pagedllm/benchmarks/llamacpp_backend.py without llama-cpp-python: the F32 copy of a GGUF
(reference: gguf.quants.dequantize of the source tensors) and the 'skipped' message."""

import importlib.util
import os

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import dequantize, quantize

from pagedllm.benchmarks.llamacpp_backend import (
    SKIP_MESSAGE,
    f32_gguf_path,
    require_llama_cpp,
    write_f32_gguf,
)
from pagedllm.benchmarks.metrics import BackendUnavailable
from pagedllm.config import ModelConfig


def _write_gguf(path: str, quantized: bool) -> dict[str, np.ndarray]:
    """A small llama-like GGUF: metadata of each kind and one tensor per storage type."""
    rng = np.random.default_rng(0)
    tensors = {
        "token_embd.weight": rng.standard_normal((8, 64), dtype=np.float32),
        "blk.0.attn_q.weight": rng.standard_normal((4, 64), dtype=np.float32),
        "output_norm.weight": rng.standard_normal(64, dtype=np.float32),
    }
    kinds = {
        "token_embd.weight": GGMLQuantizationType.Q8_0,
        "blk.0.attn_q.weight": GGMLQuantizationType.F16,
        "output_norm.weight": GGMLQuantizationType.F32,
    }
    writer = GGUFWriter(path, "llama")
    writer.add_block_count(1)
    writer.add_rope_freq_base(10000.0)
    writer.add_file_type(2 if quantized else 0)
    writer.add_key_value("tokenizer.ggml.tokens", ["a", "b"], GGUFValueType.ARRAY)
    writer.add_key_value("tokenizer.ggml.token_type", [1, 3], GGUFValueType.ARRAY)
    for name, data in tensors.items():
        kind = kinds[name] if quantized else GGMLQuantizationType.F32
        writer.add_tensor(name, quantize(data, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return tensors


def _gguf_model_config(path: str) -> ModelConfig:
    return ModelConfig(path, None, torch.float32, 64, gguf_file=path)


def test_write_f32_gguf_dequantizes_every_tensor_and_keeps_metadata(tmp_path: object) -> None:
    source, target = f"{tmp_path}/q.gguf", f"{tmp_path}/f32.gguf"
    _write_gguf(source, quantized=True)
    reader = GGUFReader(source)
    write_f32_gguf(reader, target)
    out = GGUFReader(target)
    assert out.fields["general.file_type"].contents() == 0
    for key in ("llama.block_count", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type"):
        assert out.fields[key].contents() == reader.fields[key].contents()
    assert [t.name for t in out.tensors] == [t.name for t in reader.tensors]
    for old, new in zip(reader.tensors, out.tensors):
        assert new.tensor_type == GGMLQuantizationType.F32
        assert new.shape.tolist() == old.shape.tolist()
        np.testing.assert_array_equal(new.data, dequantize(old.data, old.tensor_type))


def test_f32_gguf_path_caches_a_copy_and_keeps_f32_sources(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", f"{tmp_path}/cache")
    quantized, plain = f"{tmp_path}/m.Q8_0.gguf", f"{tmp_path}/m.F32.gguf"
    _write_gguf(quantized, quantized=True)
    _write_gguf(plain, quantized=False)
    copy = f32_gguf_path(_gguf_model_config(quantized))
    assert copy == f"{tmp_path}/cache/pagedllm/m.Q8_0.F32.gguf"
    made = os.path.getmtime(copy)
    assert f32_gguf_path(_gguf_model_config(quantized)) == copy
    assert os.path.getmtime(copy) == made
    assert f32_gguf_path(_gguf_model_config(plain)) == plain


def test_f32_gguf_path_skips_hf_folders(tmp_path: object) -> None:
    config = ModelConfig(str(tmp_path), None, torch.float32, 64)
    with pytest.raises(BackendUnavailable, match="skipped: llama.cpp needs a GGUF"):
        f32_gguf_path(config)


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is not None, reason="installed")
def test_require_llama_cpp_says_how_to_install() -> None:
    with pytest.raises(BackendUnavailable) as info:
        require_llama_cpp()
    assert str(info.value) == SKIP_MESSAGE == "skipped: pip install llama-cpp-python"
