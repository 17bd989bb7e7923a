"""_triton_ops.layernorm against the torch definition (pagedllm/_torch_ops.py)."""

import os

import pytest
import torch

pytest.importorskip("triton")

from pagedllm import _torch_ops  # noqa: E402
from pagedllm._triton_ops.layernorm import fused_add_rms_norm, rms_norm  # noqa: E402

# bfloat16 and float16 outputs are the reference's up to an ulp or two (the row's sum is taken in
# another order); float32 to rounding.
TOLERANCES = {torch.float32: 1e-5, torch.bfloat16: 1.6e-2, torch.float16: 2e-3}


def _inputs(device: torch.device, dtype: torch.dtype, shape: tuple[int, ...], seed: int):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=generator).to(device, dtype)
    residual = torch.randn(shape, generator=generator).to(device, dtype)
    weight = (1 + 0.1 * torch.randn(shape[-1], generator=generator)).to(device, dtype)
    return x, residual, weight


@pytest.mark.parametrize("dtype", list(TOLERANCES))
@pytest.mark.parametrize("shape", [(1, 64), (5, 576), (3, 100), (2, 3, 48)])
def test_rms_norm_matches_torch(
    triton_device: torch.device, dtype: torch.dtype, shape: tuple[int, ...]
) -> None:
    x, _, weight = _inputs(triton_device, dtype, shape, seed=shape[-1])
    actual = rms_norm(x, weight, 1e-6)
    expected = _torch_ops.rms_norm(x, weight, 1e-6)
    assert actual.shape == x.shape and actual.dtype == dtype
    tolerance = TOLERANCES[dtype]
    torch.testing.assert_close(actual, expected, atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("dtype", list(TOLERANCES))
@pytest.mark.parametrize("shape", [(1, 64), (7, 576), (4, 100)])
def test_fused_add_rms_norm_matches_torch(
    triton_device: torch.device, dtype: torch.dtype, shape: tuple[int, ...]
) -> None:
    x, residual, weight = _inputs(triton_device, dtype, shape, seed=2 * shape[-1])
    out, new_residual = fused_add_rms_norm(x, residual, weight, 1e-5)
    expected_out, expected_residual = _torch_ops.fused_add_rms_norm(x, residual, weight, 1e-5)
    tolerance = TOLERANCES[dtype]
    if dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1":
        # The interpreter rounds float32 to bfloat16 toward zero, a compiled kernel to
        # nearest even as torch does: an ulp apart.
        torch.testing.assert_close(new_residual, expected_residual, atol=0, rtol=2**-7)
    else:  # x + residual rounded once to the dtype: torch's bits
        assert torch.equal(new_residual, expected_residual)
    torch.testing.assert_close(out, expected_out, atol=tolerance, rtol=tolerance)


def test_strided_rows_and_an_empty_batch(triton_device: torch.device) -> None:
    wide, _, weight = _inputs(triton_device, torch.float32, (6, 96), seed=3)
    x = wide[:, 16:80]  # rows 96 apart, 64 wide
    residual = wide[:, :64]
    weight = weight[:64]
    torch.testing.assert_close(rms_norm(x, weight, 1e-6), _torch_ops.rms_norm(x, weight, 1e-6))
    out, new_residual = fused_add_rms_norm(x, residual, weight, 1e-6)
    expected = _torch_ops.fused_add_rms_norm(x, residual, weight, 1e-6)
    torch.testing.assert_close(out, expected[0])
    torch.testing.assert_close(new_residual, expected[1])
    empty = wide[:0, :64]
    assert rms_norm(empty, weight, 1e-6).shape == (0, 64)


def test_each_row_is_normed_alone(triton_device: torch.device) -> None:
    """A row's bits do not depend on the batch around it (one program a row)."""
    x, _, weight = _inputs(triton_device, torch.bfloat16, (9, 576), seed=5)
    batch = rms_norm(x, weight, 1e-6)
    for i in range(x.shape[0]):
        assert torch.equal(rms_norm(x[i : i + 1], weight, 1e-6), batch[i : i + 1])
