"""get_attn_backend: pagedllm._C's CPU backend for float32 and bfloat16 on the CPU when the
extension is built, the torch reference for everything else; the choice logged once."""

import logging

import pytest
import torch

from pagedllm import _cpu_kernels
from pagedllm.layers.attention import Attention
from pagedllm.layers.attention_backends import selector
from pagedllm.layers.attention_backends.cpu import CpuAttentionBackend
from pagedllm.layers.attention_backends.selector import get_attn_backend
from pagedllm.layers.attention_backends.torch_sdpa import TorchSdpaBackend


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
        ("cuda", torch.float32),
        ("cuda", torch.bfloat16),
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
        assert Attention(4, 8, 0.5, 2).backend.name == "torch_sdpa"
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float16)
    try:
        assert Attention(4, 8, 0.5, 2).backend.name == "torch_sdpa"
    finally:
        torch.set_default_dtype(previous)
    assert Attention(4, 8, 0.5, 2).backend.name == "cpu"


def test_the_choice_is_logged_once_per_backend_device_and_dtype(caplog) -> None:
    selector._logged.clear()
    with caplog.at_level(logging.INFO, logger="pagedllm"):
        for _ in range(3):
            get_attn_backend("cpu", torch.float32)
            get_attn_backend("cpu", torch.float16)
    lines = [r.getMessage() for r in caplog.records if "attention backend" in r.getMessage()]
    assert lines == [
        "attention backend: cpu",
        "attention backend: torch_sdpa (cpu not for cpu torch.float16)",
    ]
