"""RMSNorm against transformers' LlamaRMSNorm, LayerNorm against torch's nn.LayerNorm,
plain and with the fused residual add."""

import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from pagedllm.layers.layernorm import LayerNorm, RMSNorm

HIDDEN = 32
EPS = 1e-5


def _norm_pair() -> tuple[RMSNorm, LlamaRMSNorm]:
    """Our RMSNorm and transformers' with the same random weight."""
    weight = torch.randn(HIDDEN)
    ours = RMSNorm(HIDDEN, eps=EPS)
    ours.weight.weight_loader(ours.weight, weight)
    reference = LlamaRMSNorm(HIDDEN, eps=EPS)
    with torch.no_grad():
        reference.weight.copy_(weight)
    return ours, reference


@pytest.mark.parametrize("shape", [(5, HIDDEN), (2, 3, HIDDEN)])
def test_rms_norm_equals_transformers_llama_rms_norm(
    shape: tuple[int, ...], cpu_kernels: str
) -> None:
    """Reference: LlamaRMSNorm, x * rsqrt(mean(x^2) + eps) * weight."""
    ours, reference = _norm_pair()
    x = 3 * torch.randn(shape)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), reference(x))


def test_fused_residual_equals_add_then_llama_rms_norm(cpu_kernels: str) -> None:
    """Reference: h = x + residual; (LlamaRMSNorm(h), h). The inputs are left untouched."""
    ours, reference = _norm_pair()
    x, residual = torch.randn(4, HIDDEN), torch.randn(4, HIDDEN)
    x_before, residual_before = x.clone(), residual.clone()
    out, new_residual = ours(x, residual)
    torch.testing.assert_close(new_residual, x_before + residual_before)
    with torch.no_grad():
        torch.testing.assert_close(out, reference(x_before + residual_before))
    torch.testing.assert_close(x, x_before, rtol=0, atol=0)
    torch.testing.assert_close(residual, residual_before, rtol=0, atol=0)


def test_rms_norm_weight_starts_at_one_and_rejects_a_wrong_shape() -> None:
    """Reference: LlamaRMSNorm's initial weight of ones; a bad checkpoint shape is a ValueError."""
    norm = RMSNorm(HIDDEN)
    torch.testing.assert_close(norm.weight.data, torch.ones(HIDDEN), rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"shape mismatch.*\(33,\).*\(32,\)"):
        norm.weight.weight_loader(norm.weight, torch.ones(HIDDEN + 1))


def test_rms_norm_builds_on_the_meta_device() -> None:
    """Reference: shape-only construction, as used to check big models without memory."""
    with torch.device("meta"):
        norm = RMSNorm(8192)
    assert norm.weight.is_meta and norm.weight.shape == (8192,)


def _layer_norm_pair() -> tuple[LayerNorm, torch.nn.LayerNorm]:
    """Our LayerNorm and torch's with the same random weight and bias, loaded as a
    checkpoint's."""
    weight, bias = torch.randn(HIDDEN), torch.randn(HIDDEN)
    ours = LayerNorm(HIDDEN, eps=EPS)
    ours.weight.weight_loader(ours.weight, weight)
    ours.bias.weight_loader(ours.bias, bias)
    reference = torch.nn.LayerNorm(HIDDEN, eps=EPS)
    with torch.no_grad():
        reference.weight.copy_(weight)
        reference.bias.copy_(bias)
    return ours, reference


@pytest.mark.parametrize("shape", [(5, HIDDEN), (2, 3, HIDDEN)])
def test_layer_norm_equals_torch_layer_norm(shape: tuple[int, ...], cpu_kernels: str) -> None:
    """Reference: nn.LayerNorm (StarCoder 2's), (x - mean) * rsqrt(var + eps) * w + b."""
    ours, reference = _layer_norm_pair()
    x = 3 * torch.randn(shape) + 2
    with torch.no_grad():
        torch.testing.assert_close(ours(x), reference(x))


def test_fused_residual_equals_add_then_torch_layer_norm(cpu_kernels: str) -> None:
    """Reference: h = x + residual; (nn.LayerNorm(h), h), the inputs left untouched."""
    ours, reference = _layer_norm_pair()
    x, residual = torch.randn(4, HIDDEN), torch.randn(4, HIDDEN)
    x_before, residual_before = x.clone(), residual.clone()
    out, new_residual = ours(x, residual)
    torch.testing.assert_close(new_residual, x_before + residual_before, rtol=0, atol=0)
    with torch.no_grad():
        torch.testing.assert_close(out, reference(x_before + residual_before))
    torch.testing.assert_close(x, x_before, rtol=0, atol=0)
    torch.testing.assert_close(residual, residual_before, rtol=0, atol=0)


def test_layer_norm_starts_as_torchs_and_builds_on_the_meta_device() -> None:
    """Reference: nn.LayerNorm's initial weight of ones and bias of zeros."""
    norm = LayerNorm(HIDDEN)
    assert norm.weight.tolist() == [1.0] * HIDDEN and norm.bias.tolist() == [0.0] * HIDDEN
    with torch.device("meta"):
        norm = LayerNorm(8192)
    assert norm.weight.is_meta and norm.bias.shape == (8192,)
