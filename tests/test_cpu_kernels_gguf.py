"""pagedllm._C's GGUF kernels through their checked wrappers in _cpu_kernels, on every
instruction set this CPU runs (the others are skipped). References: gguf_gemm against the
same integer arithmetic in numpy (tests/gguf_reference.py) and against gguf.quants.dequantize
+ a float64 matmul within the error 8-bit activations allow; gguf_dequantize bit-equal to
gguf.quants.dequantize."""

import functools
from collections.abc import Callable

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES
from gguf.quants import dequantize

from pagedllm import _cpu_kernels
from tests.gguf_blocks import SUPPORTED_TYPES, Q, random_blocks
from tests.gguf_reference import activation_error_bound, gguf_gemm

pytestmark = pytest.mark.skipif(not _cpu_kernels.available(), reason="pagedllm._C not built")

ALL_ISAS = ("avx512_vnni", "avx2", "portable")
ROWS = (1, 2, 3, 4, 7, 16, 64, 300)
COLUMNS = (1, 5, 67)


def _isa(name: str) -> str:
    if name not in _cpu_kernels.gguf_isas():
        pytest.skip(f"this CPU has no {name}")
    return name


def _ks(qtype: Q) -> tuple[int, ...]:
    """Row lengths: one block, an odd number of blocks, and the default model's hidden size."""
    return (256, 768) if GGML_QUANT_SIZES[qtype][0] == 256 else (32, 96, 576)


@functools.cache
def _case(qtype: Q, k: int, n: int) -> tuple[torch.Tensor, torch.Tensor, np.ndarray, ...]:
    """x [300, K], qweight [N, bytes], and the references for all 300 rows (a row's result
    does not depend on the others, so each M checks the first M rows)."""
    rng = np.random.default_rng([int(qtype), k, n])
    qweight = random_blocks(qtype, n, k, rng)
    x = (rng.standard_normal((max(ROWS), k)) * rng.uniform(0.1, 10, (max(ROWS), 1))).astype(
        np.float32
    )
    x[1] = 0  # an all-zero row: activation scale 0
    y_int, rounding = gguf_gemm(x, qweight, qtype)
    weight = dequantize(qweight, qtype).astype(np.float64)
    y_float = x.astype(np.float64) @ weight.T
    float_bound = (
        activation_error_bound(x, weight) * (1 + 1e-4)
        + rounding
        + 2.0**-22 * (np.abs(x.astype(np.float64)) @ np.abs(weight).T)
    )
    return torch.from_numpy(x), torch.from_numpy(qweight), y_int, rounding, y_float, float_bound


@pytest.mark.parametrize("isa", ALL_ISAS)
@pytest.mark.parametrize("qtype", SUPPORTED_TYPES, ids=lambda t: t.name)
def test_gguf_gemm_is_the_integer_arithmetic_of_the_reference(qtype: Q, isa: str) -> None:
    """Reference: gguf_reference.gguf_gemm, the same activation quantization, exact integer
    block dots and float32 factors summed in float64; the kernel's float32 sums may differ by
    its rounding_bound ((blocks + 16) unit roundoffs of sum |terms|), per output element."""
    isa = _isa(isa)
    for k in _ks(qtype):
        for n in COLUMNS:
            x, qweight, y_int, rounding, _, _ = _case(qtype, k, n)
            for m in ROWS:
                y = _cpu_kernels.gguf_gemm(x[:m], qweight, qtype, isa=isa).double().numpy()
                err = np.abs(y - y_int[:m])
                assert (err <= rounding[:m]).all(), (k, n, m, (err - rounding[:m]).max())


@pytest.mark.parametrize("isa", ALL_ISAS)
@pytest.mark.parametrize("qtype", SUPPORTED_TYPES, ids=lambda t: t.name)
def test_gguf_gemm_is_within_the_activation_error_of_the_float_product(qtype: Q, isa: str) -> None:
    """Reference: x @ gguf.quants.dequantize(W)^T in float64. Quantizing x to 8 bits moves
    each element by |x - d q| <= d / 2 = amax_block / 254 (times 1 + 1e-4 for d and 1 / d
    being float32), so per output element |y - y_ref| <= sum over blocks of amax_block / 254
    * sum |w| in the block, plus the kernel's float rounding (rounding_bound, and 2^-22 sum
    |x w| for the weight scales' products)."""
    isa = _isa(isa)
    for k in _ks(qtype):
        for n in COLUMNS:
            x, qweight, _, _, y_float, bound = _case(qtype, k, n)
            for m in ROWS:
                y = _cpu_kernels.gguf_gemm(x[:m], qweight, qtype, isa=isa).double().numpy()
                err = np.abs(y - y_float[:m])
                assert (err <= bound[:m]).all(), (k, n, m, (err - bound[:m]).max())


@pytest.mark.parametrize("qtype", SUPPORTED_TYPES, ids=lambda t: t.name)
def test_gguf_gemm_adds_the_bias(qtype: Q) -> None:
    """Reference: the kernel without bias, plus the bias (one float32 add)."""
    x, qweight, *_ = _case(qtype, _ks(qtype)[-1], 67)
    bias = torch.randn(67)
    expected = _cpu_kernels.gguf_gemm(x[:5], qweight, qtype) + bias
    assert torch.equal(_cpu_kernels.gguf_gemm(x[:5], qweight, qtype, bias), expected)


@pytest.mark.parametrize("qtype", SUPPORTED_TYPES, ids=lambda t: t.name)
def test_gguf_dequantize_is_bit_equal_to_gguf(qtype: Q) -> None:
    """Reference: gguf.quants.dequantize, compared bit for bit; scales include zero, negative
    zero and subnormal fp16 values, which the kernel converts exactly."""
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(int(qtype))
    qweight = random_blocks(qtype, 9, block_size * 5, rng)
    blocks = qweight.reshape(-1, type_size)
    offset = 208 if qtype == Q.Q6_K else 0
    for i, bits in enumerate((0x0000, 0x8000, 0x0001, 0x83FF, 0x0400)):
        blocks[i, offset : offset + 2] = np.array([bits], np.uint16).view(np.uint8)
    expected = dequantize(qweight, qtype)
    out = _cpu_kernels.gguf_dequantize(torch.from_numpy(qweight), qtype).numpy()
    np.testing.assert_array_equal(out.view(np.uint32), expected.view(np.uint32))


def test_gguf_isas_are_the_supported_ones_best_first() -> None:
    """The portable path runs everywhere; the list keeps ALL_ISAS' order."""
    isas = _cpu_kernels.gguf_isas()
    assert isas[-1] == "portable"
    assert list(isas) == [name for name in ALL_ISAS if name in isas]


QW = torch.from_numpy(random_blocks(Q.Q4_1, 5, 64, np.random.default_rng(0)))  # [5, 40]


def _gemm(**override: object) -> torch.Tensor:
    args = {"x": torch.randn(2, 64), "qweight": QW, "qtype": Q.Q4_1, "bias": torch.randn(5)}
    return _cpu_kernels.gguf_gemm(**{**args, **override})


BAD_CALLS: dict[str, tuple[Callable[[], object], str]] = {
    "qweight float32": (
        lambda: _gemm(qweight=QW.float()),
        r"gguf_gemm: qweight must be a contiguous uint8 CPU tensor .* got float32",
    ),
    "qweight 1-D": (lambda: _gemm(qweight=QW.flatten()), "qweight must be"),
    "qweight strided": (lambda: _gemm(qweight=QW.t().contiguous().t()), "qweight must be a contig"),
    "qweight rows not whole blocks": (
        lambda: _gemm(qweight=QW[:, :30].contiguous()),
        "qweight rows of 30 bytes are not whole Q4_1 blocks of 20 bytes",
    ),
    "qtype unsupported": (
        lambda: _gemm(qtype=Q.Q2_K),
        "gguf_gemm: qtype .*Q2_K.* is not one of the supported GGUF types Q4_0=2, Q4_1=3",
    ),
    "qtype not an int": (lambda: _gemm(qtype="Q4_1"), "qtype 'Q4_1' is not one of"),
    "x of another K": (
        lambda: _gemm(x=torch.randn(2, 32)),
        r"x \[M, K\] has K = 32, qweight's rows hold 64 elements",
    ),
    "x float64": (lambda: _gemm(x=torch.randn(2, 64).double()), "x must be .* float32"),
    "x 3-D": (lambda: _gemm(x=torch.randn(1, 2, 64)), r"x must be .* \[M, K\]"),
    "x strided": (lambda: _gemm(x=torch.randn(64, 2).t()), "x must be a contiguous"),
    "bias of another size": (lambda: _gemm(bias=torch.randn(4)), r"bias must .* = \[5\]"),
    "isa unknown": (lambda: _gemm(isa="neon"), "isa 'neon' is not one of this CPU's"),
    "dequantize float input": (
        lambda: _cpu_kernels.gguf_dequantize(QW.float(), Q.Q4_1),
        "gguf_dequantize: qweight must be",
    ),
    "dequantize out of another shape": (
        lambda: _cpu_kernels.gguf_dequantize(QW, Q.Q4_1, out=torch.empty(5, 32)),
        r"out must .* = \[5, 64\]",
    ),
}


@pytest.mark.parametrize("case", BAD_CALLS)
def test_a_wrong_call_raises_value_error_naming_the_argument(case: str) -> None:
    call, message = BAD_CALLS[case]
    with pytest.raises(ValueError, match=message):
        call()


def test_the_valid_call_above_runs() -> None:
    assert _gemm().shape == (2, 5)
    assert _cpu_kernels.gguf_dequantize(QW, Q.Q4_1).shape == (5, 64)


def test_empty_shapes() -> None:
    """No rows of x, or a weight of no rows, give empty outputs."""
    assert _gemm(x=torch.randn(0, 64)).shape == (0, 5)
    empty = QW[:0]
    assert _cpu_kernels.gguf_gemm(torch.randn(3, 64), empty, Q.Q4_1).shape == (3, 0)
    assert _cpu_kernels.gguf_dequantize(empty, Q.Q4_1).shape == (0, 64)
