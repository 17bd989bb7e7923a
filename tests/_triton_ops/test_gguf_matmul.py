"""_triton_ops.gguf_matmul against the torch reference it replaces on GPUs
(_torch_quant.dequantize, then F.linear in x's dtype) on random blocks of each type."""

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

from pagedllm import _torch_ops, _torch_quant  # noqa: E402
from pagedllm._triton_ops.gguf_matmul import TYPES, gguf_matmul  # noqa: E402
from tests.gguf_blocks import random_blocks  # noqa: E402

# float32 to rounding (IEEE products, float32 sums in another order); bf16/fp16 x and weights
# rounded alike, the sums' order apart
TOLERANCES = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def _case(qtype, m: int, n: int, k: int, dtype: torch.dtype, device: torch.device):
    rng = np.random.default_rng([int(qtype), m, n, k])
    qweight = torch.from_numpy(random_blocks(qtype, n, k, rng)).to(device)
    x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32)).to(device, dtype)
    bias = torch.from_numpy(rng.standard_normal(n).astype(np.float32)).to(device, dtype)
    return x, qweight, bias


@pytest.mark.parametrize("dtype", list(TOLERANCES))
@pytest.mark.parametrize("qtype", list(TYPES), ids=lambda t: t.name)
@pytest.mark.parametrize(("m", "n", "k"), [(1, 48, 32), (5, 64, 96), (33, 80, 256)])
def test_matches_dequantize_then_linear(
    triton_device: torch.device, qtype, dtype: torch.dtype, m: int, n: int, k: int
) -> None:
    x, qweight, bias = _case(qtype, m, n, k, dtype, triton_device)
    weight = _torch_quant.dequantize(qweight, qtype).to(dtype)
    for b in (None, bias):
        got = gguf_matmul(x, qweight, qtype, b)
        want = _torch_ops.linear(x, weight, b)
        assert got.shape == (m, n) and got.dtype == dtype
        scale = want.abs().max().item()
        torch.testing.assert_close(got, want, atol=TOLERANCES[dtype] * scale, rtol=0)


def test_leading_dimensions_and_an_empty_batch(triton_device: torch.device) -> None:
    x, qweight, _ = _case(TYPES.__iter__().__next__(), 6, 32, 64, torch.float32, triton_device)
    qtype = next(iter(TYPES))
    got = gguf_matmul(x.view(2, 3, 64), qweight, qtype)
    assert got.shape == (2, 3, 32)
    torch.testing.assert_close(got.view(6, 32), gguf_matmul(x, qweight, qtype))
    assert gguf_matmul(x[:0], qweight, qtype).shape == (0, 32)
    with pytest.raises(ValueError, match="do not hold 96 weights"):
        gguf_matmul(torch.zeros(1, 96, device=triton_device), qweight, qtype)


def test_cuda_linear_layers_of_these_types_take_the_kernel(
    triton_device: torch.device, monkeypatch: pytest.MonkeyPatch
) -> None:
    """_custom_ops.gguf_linear routes CUDA weights of Q4_0 / Q4_1 / Q8_0 here (CPU ones run
    pagedllm._C, or torch without it)."""
    from pagedllm import _custom_ops
    from pagedllm._triton_ops import gguf_matmul as module

    qtype = next(iter(TYPES))
    x, qweight, _ = _case(qtype, 3, 32, 64, torch.bfloat16, triton_device)
    calls = []
    monkeypatch.setattr(module, "gguf_matmul", lambda *args: calls.append(args) or args[0])
    _custom_ops.gguf_linear(x, qweight, qtype)
    assert len(calls) == (1 if triton_device.type == "cuda" else 0)
