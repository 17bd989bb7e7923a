"""_triton_ops.activation's silu_and_mul and gelu_and_mul against torch's silu(gate) * up and
F.gelu(gate) * up."""

import pytest
import torch
import torch.nn.functional as F

from pagedllm import _torch_ops

pytest.importorskip("triton")

from pagedllm._triton_ops.activation import gelu_and_mul, silu_and_mul  # noqa: E402


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("rows, d", [(1, 8), (7, 48), (3, 1100)])
def test_matches_torch(
    triton_device: torch.device, dtype: torch.dtype, tolerance: float, rows: int, d: int
) -> None:
    generator = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 2 * d, generator=generator).to(triton_device, dtype)
    expected = F.silu(x[:, :d].float()) * x[:, d:].float()
    actual = silu_and_mul(x)
    assert actual.shape == (rows, d) and actual.dtype == dtype
    torch.testing.assert_close(actual.float(), expected, atol=tolerance, rtol=tolerance)


# The interpreter's numpy e^x warns where it overflows to inf, which sigmoid takes to 0.
@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-6), (torch.bfloat16, 2**-6)])
@pytest.mark.parametrize("rows, d", [(1, 8), (7, 48), (3, 1100)])
def test_gelu_matches_torch(
    triton_device: torch.device,
    dtype: torch.dtype,
    tolerance: float,
    rows: int,
    d: int,
    approximate: str,
) -> None:
    """Reference: _torch_ops.gelu_and_mul, F.gelu(gate, approximate) * up in the inputs'
    dtype; in bfloat16, rounded as the kernel rounds, the last float bits of gelu may move
    its rounding by a step, two after the product (2^-6 relative). Gates out to +-30 on a
    grid, +-1e4 where e^x must not overflow."""
    generator = torch.Generator().manual_seed(rows)
    gate = torch.linspace(-30, 30, rows * d).view(rows, d)
    gate[0, :2] = torch.tensor([1e4, -1e4])
    x = torch.cat([gate, torch.randn(rows, d, generator=generator)], -1).to(triton_device, dtype)
    expected = _torch_ops.gelu_and_mul(x, approximate)
    actual = gelu_and_mul(x, approximate)
    assert actual.shape == (rows, d) and actual.dtype == dtype
    torch.testing.assert_close(actual, expected, atol=tolerance, rtol=tolerance)


def test_gelu_refuses_another_form(triton_device: torch.device) -> None:
    with pytest.raises(ValueError, match="approximate must be one of"):
        gelu_and_mul(torch.zeros(1, 2, device=triton_device), "erf")
