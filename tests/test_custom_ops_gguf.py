"""_custom_ops' GGUF ops: packed weights through pagedllm._C's kernel or the float fallback,
blocks through torch. Reference: _torch_quant (dequantize, bit-equal to gguf, then F.linear),
in float64 where the kernel's arithmetic differs."""

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


def _packed(qtype: Q, n: int, k: int, seed: int = 0) -> torch.Tensor:
    return _custom_ops.gguf_pack(_weight(qtype, n, k, seed), qtype)


@needs_kernels
@pytest.mark.parametrize("qtype", SUPPORTED_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gguf_packed_linear_is_within_the_activation_error(qtype: Q, dtype: torch.dtype) -> None:
    """Every row count multiplies the packed blocks with 8-bit x: each output is within sum
    over blocks of amax_block / 254 * sum |w| of the float reference (see
    test_cpu_kernels_gguf), plus 1e-5 * sum |x w| for float rounding (bfloat16: x as given,
    y within a bfloat16 rounding of that)."""
    k = _k(qtype)
    qweight, bias = _weight(qtype, 37, k), torch.randn(37)
    packed = _custom_ops.gguf_pack(qweight, qtype)
    for m in (1, 5, 40):
        x = torch.randn(m, k).to(dtype)
        y = _custom_ops.gguf_packed_linear(x, packed, qtype, 37, bias.to(dtype))
        assert y.dtype == dtype
        w = _torch_quant.dequantize(qweight, qtype).double()
        xd = x.double()
        bound = activation_error_bound(xd.float().numpy(), w.numpy()) * (1 + 1e-4)
        bound += 1e-5 * (xd.abs() @ w.abs().T).numpy()
        expected = _float_reference(xd, qweight, qtype, bias.to(dtype))
        if dtype is torch.bfloat16:
            bound += 2.0**-8 * expected.abs().numpy()
        assert ((y.double() - expected).abs().numpy() <= bound).all()


@needs_kernels
@pytest.mark.parametrize("rows", [1, 6, 40])
def test_gguf_packed_linear_keeps_leading_dims(rows: int) -> None:
    """x [2, rows / 2, K] (or 1-D) -> [..., N], as F.linear. Reference: the op on the
    flattened rows."""
    packed = _packed(Q.Q4_1, 24, 64)
    x = torch.randn(rows, 64)
    flat = _custom_ops.gguf_packed_linear(x, packed, Q.Q4_1, 24)
    if rows == 1:
        assert torch.equal(_custom_ops.gguf_packed_linear(x[0], packed, Q.Q4_1, 24), flat[0])
        return
    x3 = x.view(2, rows // 2, 64)
    y3 = _custom_ops.gguf_packed_linear(x3, packed, Q.Q4_1, 24)
    assert torch.equal(y3, flat.view(2, rows // 2, 24))


@needs_kernels
def test_gguf_packed_linear_reads_a_transposed_input() -> None:
    """A non-contiguous x is copied first. Reference: the op on x.contiguous()."""
    packed = _packed(Q.Q8_0, 8, 64)
    x = torch.randn(64, 3).t()
    assert torch.equal(
        _custom_ops.gguf_packed_linear(x, packed, Q.Q8_0, 8),
        _custom_ops.gguf_packed_linear(x.contiguous(), packed, Q.Q8_0, 8),
    )


@needs_kernels
@pytest.mark.parametrize(
    "dtype,requires_grad", [(torch.float64, False), (torch.float16, False), (torch.float32, True)]
)
def test_gguf_packed_linear_falls_back_to_f_linear_where_the_kernel_does_not_apply(
    dtype: torch.dtype, requires_grad: bool
) -> None:
    """Other dtypes and autograd unpack the weight (bit-equal to dequantize) and run
    F.linear: the torch reference's results, and gradients flow to x."""
    qweight = _weight(Q.Q4_0, 8, 64)
    packed = _custom_ops.gguf_pack(qweight, Q.Q4_0)
    x = torch.randn(3, 64, dtype=dtype, requires_grad=requires_grad)
    y = _custom_ops.gguf_packed_linear(x, packed, Q.Q4_0, 8)
    assert torch.equal(y, _torch_quant.gguf_linear(x, qweight, Q.Q4_0))
    if requires_grad:
        y.sum().backward()
        assert x.grad is not None and x.grad.shape == x.shape


@needs_kernels
def test_gguf_pack_packs_stacked_experts_one_by_one() -> None:
    """qweight [E, N, bytes] -> [E, groups, bytes]; each expert's slice is that expert
    packed alone."""
    qweight = _weight(Q.Q6_K, 3 * 20, 256).view(3, 20, -1)
    packed = _custom_ops.gguf_pack(qweight, Q.Q6_K)
    assert packed.shape == (3, *_cpu_kernels.gguf_packed_shape(Q.Q6_K, 20, 256))
    for e in range(3):
        assert torch.equal(packed[e], _cpu_kernels.gguf_pack(qweight[e].contiguous(), Q.Q6_K))


def test_gguf_pack_leaves_weights_the_kernels_do_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the extension (or off the CPU) the blocks stay: gguf_pack returns None and
    gguf_linear multiplies them in torch."""
    monkeypatch.setattr(_cpu_kernels, "_C", None)
    assert _custom_ops.gguf_pack(_weight(Q.Q4_1, 4, 64), Q.Q4_1) is None


@needs_kernels
@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_K])
def test_gguf_packed_embedding_dequantizes_the_looked_up_rows(qtype: Q) -> None:
    """ids [2, 3] with a repeat -> [2, 3, K]. Reference: the whole table dequantized, then
    indexed, bit for bit."""
    table = _weight(qtype, 50, _k(qtype))
    packed = _custom_ops.gguf_pack(table, qtype)
    ids = torch.tensor([[3, 49, 0], [7, 3, 12]])
    out = _custom_ops.gguf_packed_embedding(ids, packed, qtype, 50, _k(qtype))
    expected = _torch_quant.dequantize(table, qtype)[ids]
    assert out.shape == (2, 3, _k(qtype))
    assert torch.equal(out.view(torch.int32), expected.view(torch.int32))


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
