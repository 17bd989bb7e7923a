"""get_attn_backend: unnamed, the Triton backend on CUDA where triton is installed,
pagedllm._C's CPU backend for float32 and bfloat16 on the CPU when the extension is built, the
torch reference for everything else; the choice logged once. Named (use_attn_backend), that
backend, or a ValueError naming those that can run."""

import logging

import pytest
import torch

from pagedllm import _cpu_kernels, _triton_ops
from pagedllm.layers.attention import Attention
from pagedllm.layers.attention_backends import selector
from pagedllm.layers.attention_backends.cpu import CpuAttentionBackend
from pagedllm.layers.attention_backends.selector import get_attn_backend
from pagedllm.layers.attention_backends.torch_sdpa import TorchSdpaBackend
from pagedllm.layers.attention_backends.triton_attn import TritonAttentionBackend


def test_float32_cpu_with_the_extension_gets_the_cpu_backend() -> None:
    assert _cpu_kernels.available(), "pagedllm._C is missing: pip install -e . needs gcc"
    backend = get_attn_backend(torch.device("cpu"), torch.float32)
    assert isinstance(backend, CpuAttentionBackend)
    assert isinstance(get_attn_backend("cpu", torch.float32), CpuAttentionBackend)
    assert isinstance(get_attn_backend("cpu", torch.bfloat16), CpuAttentionBackend)


@pytest.mark.parametrize(
    "device,dtype",
    [
        ("cpu", torch.float16),
        ("cpu", torch.float64),
        ("meta", torch.float32),
        ("cuda", torch.float64),
    ],
)
def test_other_devices_and_dtypes_get_the_torch_reference(device: str, dtype: torch.dtype) -> None:
    backend = get_attn_backend(torch.device(device), dtype)
    assert type(backend) is TorchSdpaBackend


def test_without_the_extension_float32_cpu_gets_the_torch_reference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_cpu_kernels, "_C", None)
    assert type(get_attn_backend(torch.device("cpu"), torch.float32)) is TorchSdpaBackend


def test_attention_built_on_meta_or_in_float16_selects_the_reference() -> None:
    """The layer asks for the loader's default device and dtype (model_loader.build_model)."""
    with torch.device("meta"):
        assert Attention(4, 8, 0.5, 2).backend.name == "TORCH_SDPA"
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float16)
    try:
        assert Attention(4, 8, 0.5, 2).backend.name == "TORCH_SDPA"
    finally:
        torch.set_default_dtype(previous)
    assert Attention(4, 8, 0.5, 2).backend.name == "CPU_ATTN"


def test_the_choice_is_logged_once_per_backend_device_and_dtype(caplog) -> None:
    selector._logged.clear()
    with caplog.at_level(logging.INFO, logger="pagedllm"):
        for _ in range(3):
            get_attn_backend("cpu", torch.float32)
            get_attn_backend("cpu", torch.float16)
            get_attn_backend("meta", torch.float32)  # a model sized (inspect): not logged
    lines = [r.getMessage() for r in caplog.records if "attention backend" in r.getMessage()]
    assert lines == [
        "attention backend: CPU_ATTN",
        "attention backend: TORCH_SDPA (CPU_ATTN not for cpu torch.float16)",
    ]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cuda_gets_the_triton_backend_where_triton_is_installed(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype
) -> None:
    """Choosing builds nothing on the device, so this holds without a GPU."""
    pytest.importorskip("triton")
    assert isinstance(get_attn_backend("cuda", dtype), TritonAttentionBackend)
    monkeypatch.setattr(_triton_ops, "has_triton", lambda: False)
    assert type(get_attn_backend("cuda", dtype)) is TorchSdpaBackend


def test_unnamed_the_cpu_never_gets_the_triton_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_cpu_kernels, "_C", None)
    monkeypatch.setattr(_triton_ops, "interpreting", lambda: True)
    assert TritonAttentionBackend.supports(torch.device("cpu"), torch.float32)
    assert type(get_attn_backend("cpu", torch.float32)) is TorchSdpaBackend


def test_an_fp8_kv_cache_rules_out_the_cpu_kernels() -> None:
    """The layers built for an fp8 cache on a CPU get the torch reference; CPU_ATTN named
    for one is a ValueError naming those that read it."""
    with selector.use_attn_backend(None, torch.float8_e4m3fn):
        assert Attention(4, 8, 0.5, 2).backend.name == "TORCH_SDPA"
    with (
        selector.use_attn_backend("CPU_ATTN", torch.float8_e4m3fn),
        pytest.raises(ValueError, match="needs a KV cache it can read, not torch.float8_e4m3fn"),
    ):
        Attention(4, 8, 0.5, 2)


def test_a_named_backend_is_used_for_the_layers_built_inside(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_triton_ops, "interpreting", lambda: True)
    with selector.use_attn_backend("TORCH_SDPA"):
        assert Attention(4, 8, 0.5, 2).backend.name == "TORCH_SDPA"
        with selector.use_attn_backend("TRITON_ATTN"):
            assert isinstance(Attention(4, 8, 0.5, 2).backend, TritonAttentionBackend)
        assert Attention(4, 8, 0.5, 2).backend.name == "TORCH_SDPA"
    assert Attention(4, 8, 0.5, 2).backend.name == "CPU_ATTN"


@pytest.mark.parametrize(
    "name,dtype,interpret,error",
    [
        ("CPU_ATTN", torch.float16, True, "CPU_ATTN cannot run torch.float16 on cpu: it needs "),
        ("TRITON_ATTN", torch.float64, True, "here use one of TORCH_SDPA$"),
        ("TRITON_ATTN", torch.float32, False, "TRITON_INTERPRET=1.*CPU_ATTN, TORCH_SDPA$"),
        ("flash_attn", torch.float32, True, "'flash_attn' is not one of TRITON_ATTN, CPU_ATTN"),
    ],
)
def test_a_named_backend_that_cannot_run_is_a_value_error(
    monkeypatch: pytest.MonkeyPatch, name: str, dtype: torch.dtype, interpret: bool, error: str
) -> None:
    monkeypatch.setattr(_triton_ops, "interpreting", lambda: interpret)
    with selector.use_attn_backend(name), pytest.raises(ValueError, match=error):
        get_attn_backend("cpu", dtype)
