"""pagedllm/benchmarks/llamacpp_backend.py: which GGUF the peer runs (the issue: the same
quantized file as pagedllm, an F32 copy when pagedllm dequantizes), the 'skipped' message without
llama-cpp-python, and a short run on the default model with it."""

import importlib.util
import json
from collections.abc import Callable

import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader

from pagedllm.benchmarks.llamacpp_backend import (
    SKIP_MESSAGE,
    llamacpp_model_path,
    require_llama_cpp,
)
from pagedllm.benchmarks.metrics import BackendUnavailable
from pagedllm.config import ModelConfig, default_model_path
from tests.benchmarks.conftest import write_mixed_gguf


def _gguf_model_config(path: str, quantization: str | None) -> ModelConfig:
    return ModelConfig(path, None, torch.float32, 64, gguf_file=path, quantization=quantization)


def test_llamacpp_runs_the_quantized_file_itself(tmp_path: object) -> None:
    path = f"{tmp_path}/m.Q8_0.gguf"
    write_mixed_gguf(path)
    assert llamacpp_model_path(_gguf_model_config(path, "gguf")) == path


def test_llamacpp_runs_an_f32_copy_when_pagedllm_dequantizes(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", f"{tmp_path}/cache")
    path = f"{tmp_path}/m.Q8_0.gguf"
    write_mixed_gguf(path)
    copy = llamacpp_model_path(_gguf_model_config(path, None))
    assert copy == f"{tmp_path}/cache/pagedllm/m.Q8_0.F32.gguf"
    assert {t.tensor_type for t in GGUFReader(copy).tensors} == {GGMLQuantizationType.F32}


def test_llamacpp_skips_hf_folders(tmp_path: object) -> None:
    config = ModelConfig(str(tmp_path), None, torch.float32, 64)
    with pytest.raises(BackendUnavailable, match="skipped: llama.cpp needs a GGUF"):
        llamacpp_model_path(config)


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is not None, reason="installed")
def test_require_llama_cpp_says_how_to_install() -> None:
    with pytest.raises(BackendUnavailable) as info:
        require_llama_cpp()
    assert str(info.value) == SKIP_MESSAGE == "skipped: pip install llama-cpp-python"


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="not installed")
def test_llamacpp_runs_the_default_models_q4_1_file(
    run_bench: Callable[[list[str]], str], tmp_path: object
) -> None:
    """The peer loads and decodes the quantized file itself (a llama.cpp build with AMX
    int8 crashes on every quantized model on AMX CPUs)."""
    json_path = f"{tmp_path}/latency.json"
    argv = ["latency", "--backend", "llama.cpp", "--input-len", "8", "--output-len", "3"]
    argv += ["--num-iters", "1", "--num-warmup", "0", "--bandwidth-mb", "8"]
    run_bench([*argv, "--json", json_path])
    report = json.load(open(json_path))
    assert report["config"]["model"] == default_model_path()
    assert report["config"]["quantization"] == "gguf"
    assert report["results"]["llama.cpp"]["decode_tokens_per_s"] > 0
