"""_custom_ops' GGUF ops on both of gguf_linear's paths and on the torch fallback. Reference:
_torch_quant (dequantize, bit-equal to gguf, then F.linear), in float64 where the kernels'
summation order differs."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pagedllm import _cpu_kernels, _custom_ops, _torch_quant
from tests.gguf_blocks import SUPPORTED_TYPES, Q, random_blocks
from tests.gguf_reference import activation_error_bound

needs_kernels = pytest.mark.skipif(not _cpu_kernels.available(), reason="pagedllm._C not built")


def _weight(qtype: Q, n: int, k: int, seed: int = 0) -> torch.Tensor:
    return torch.from_numpy(random_blocks(qtype, n, k, np.random.default_rng(seed)))


def _k(qtype: Q) -> int:
    return 512 if qtype in (Q.Q4_K, Q.Q5_K, Q.Q6_K) else 96


def _float_reference(x: torch.Tensor, qweight: torch.Tensor, qtype: Q, bias=None):
    """F.linear of the dequantized weight in float64 [..., N]."""
    w = _torch_quant.dequantize(qweight, qtype).double()
    return F.linear(x.double(), w, None if bias is None else bias.double())


@needs_kernels
@pytest.mark.parametrize("qtype", SUPPORTED_TYPES, ids=lambda t: t.name)
def test_gguf_linear_decode_rows_are_within_the_activation_error(qtype: Q) -> None:
    """Up to GGUF_DECODE_MAX_ROWS rows multiply the blocks with 8-bit x: each output is
    within sum over blocks of amax_block / 254 * sum |w| of the float reference (see
    test_cpu_kernels_gguf), plus 1e-5 * sum |x w| for float rounding."""
    k, m = _k(qtype), _custom_ops.GGUF_DECODE_MAX_ROWS
    qweight, bias = _weight(qtype, 37, k), torch.randn(37)
    x = torch.randn(m, k)
    y = _custom_ops.gguf_linear(x, qweight, qtype, bias)
    w = _torch_quant.dequantize(qweight, qtype).double()
    bound = activation_error_bound(x.numpy(), w.numpy()) * (1 + 1e-4)
    bound += 1e-5 * (x.double().abs() @ w.abs().T).numpy()
    err = (y.double() - _float_reference(x, qweight, qtype, bias)).abs().numpy()
    assert (err <= bound).all()


@needs_kernels
@pytest.mark.parametrize("qtype", SUPPORTED_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("tile_rows", [16, 256])
def test_gguf_linear_prefill_rows_match_dequantize_and_f_linear(
    qtype: Q, tile_rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past GGUF_DECODE_MAX_ROWS the weight is dequantized (exactly) and multiplied in
    float32: tiles of 16 rows over 37 (two whole, one of 5) and one tile of all 37; with and
    without bias. Reference: float64, up to float32 rounding: 2^-20 sum |x w| per element."""
    k = _k(qtype)
    monkeypatch.setattr(_custom_ops, "GGUF_PREFILL_TILE_ELEMENTS", tile_rows * k)
    qweight, bias = _weight(qtype, 37, k), torch.randn(37)
    x = torch.randn(_custom_ops.GGUF_DECODE_MAX_ROWS + 3, k)
    w = _torch_quant.dequantize(qweight, qtype).double()
    bound = 2.0**-20 * (x.double().abs() @ w.abs().T + bias.double().abs())
    for b in (None, bias):
        err = (
            _custom_ops.gguf_linear(x, qweight, qtype, b) - _float_reference(x, qweight, qtype, b)
        ).abs()
        assert (err <= bound).all()


@needs_kernels
@pytest.mark.parametrize("rows", [1, 6, 40])
def test_gguf_linear_keeps_leading_dims(rows: int) -> None:
    """x [2, rows / 2, K] (or 1-D) -> [..., N], as F.linear; rows 1 and 6 take the decode
    path, 40 the prefill path. Reference: the op on the flattened rows."""
    qweight = _weight(Q.Q4_1, 24, 64)
    x = torch.randn(rows, 64)
    flat = _custom_ops.gguf_linear(x, qweight, Q.Q4_1)
    if rows == 1:
        assert torch.equal(_custom_ops.gguf_linear(x[0], qweight, Q.Q4_1), flat[0])
        return
    x3 = x.view(2, rows // 2, 64)
    assert torch.equal(_custom_ops.gguf_linear(x3, qweight, Q.Q4_1), flat.view(2, rows // 2, 24))


@needs_kernels
def test_gguf_linear_reads_a_transposed_input() -> None:
    """A non-contiguous x is copied first. Reference: the op on x.contiguous()."""
    qweight = _weight(Q.Q8_0, 8, 64)
    x = torch.randn(64, 3).t()
    assert torch.equal(
        _custom_ops.gguf_linear(x, qweight, Q.Q8_0),
        _custom_ops.gguf_linear(x.contiguous(), qweight, Q.Q8_0),
    )


@pytest.mark.parametrize(
    "dtype,requires_grad", [(torch.float64, False), (torch.bfloat16, False), (torch.float32, True)]
)
def test_gguf_linear_falls_back_to_torch_where_the_kernels_do_not_apply(
    dtype: torch.dtype, requires_grad: bool
) -> None:
    """Other dtypes and autograd run _torch_quant.gguf_linear itself: bit-identical results,
    and gradients flow to x."""
    qweight = _weight(Q.Q4_0, 8, 64)
    x = torch.randn(3, 64, dtype=dtype, requires_grad=requires_grad)
    y = _custom_ops.gguf_linear(x, qweight, Q.Q4_0)
    assert torch.equal(y, _torch_quant.gguf_linear(x, qweight, Q.Q4_0))
    if requires_grad:
        y.sum().backward()
        assert x.grad is not None and x.grad.shape == x.shape


def test_gguf_ops_without_the_extension_are_the_torch_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_cpu_kernels, "_C", None)
    qweight, x = _weight(Q.Q6_K, 4, 256), torch.randn(2, 256)
    assert torch.equal(
        _custom_ops.gguf_linear(x, qweight, Q.Q6_K), _torch_quant.gguf_linear(x, qweight, Q.Q6_K)
    )
    assert torch.equal(
        _custom_ops.gguf_dequantize(qweight, Q.Q6_K), _torch_quant.dequantize(qweight, Q.Q6_K)
    )


@pytest.mark.parametrize("qtype", SUPPORTED_TYPES, ids=lambda t: t.name)
def test_gguf_dequantize_keeps_leading_dims_bit_equal_to_torch(qtype: Q) -> None:
    """qweight [2, 3, bytes] -> [2, 3, K]. Reference: _torch_quant.dequantize, bit for bit."""
    qweight = _weight(qtype, 6, _k(qtype)).view(2, 3, -1)
    out = _custom_ops.gguf_dequantize(qweight, qtype)
    assert out.shape == (2, 3, _k(qtype))
    assert torch.equal(
        out.view(torch.int32), _torch_quant.dequantize(qweight, qtype).view(torch.int32)
    )


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_K])
def test_gguf_embedding_dequantizes_the_looked_up_rows(qtype: Q) -> None:
    """ids [2, 3] with a repeat -> [2, 3, K]. Reference: the whole table dequantized, then
    indexed, bit for bit."""
    table = _weight(qtype, 50, _k(qtype))
    ids = torch.tensor([[3, 49, 0], [7, 3, 12]])
    out = _custom_ops.gguf_embedding(ids, table, qtype)
    expected = _torch_quant.dequantize(table, qtype)[ids]
    assert out.shape == (2, 3, _k(qtype))
    assert torch.equal(out.view(torch.int32), expected.view(torch.int32))
