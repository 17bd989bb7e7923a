"""_triton_ops.activation.silu_and_mul against torch's silu(gate) * up."""

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from pagedllm._triton_ops.activation import silu_and_mul  # noqa: E402


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
