"""pagedllm._C's GGUF kernels through their checked wrappers in _cpu_kernels, on every
instruction set this CPU runs (the others are skipped). References: gguf_mm against the same
integer arithmetic in numpy (tests/gguf_reference.py) and against gguf.quants.dequantize + a
float64 matmul within the error 8-bit activations allow; a row's bits against the same row in
any other batch and on any other build; gguf_unpack_rows and gguf_dequantize bit-equal to
gguf.quants.dequantize."""

import functools
from collections.abc import Callable

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES
from gguf.quants import dequantize

from pagedllm import _cpu_kernels
from tests.gguf_blocks import FP16_FIELDS, SUPPORTED_TYPES, Q, random_blocks
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
    """x [300, K], the weight packed, and the references for all 300 rows (a row's result
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
    packed = _cpu_kernels.gguf_pack(torch.from_numpy(qweight), qtype)
    return torch.from_numpy(x), packed, y_int, rounding, y_float, float_bound


@pytest.mark.parametrize("isa", ALL_ISAS)
@pytest.mark.parametrize("qtype", SUPPORTED_TYPES, ids=lambda t: t.name)
def test_gguf_mm_is_the_integer_arithmetic_of_the_reference(qtype: Q, isa: str) -> None:
    """Reference: gguf_reference.gguf_gemm, the same activation quantization, exact integer
    block dots and float32 factors summed in float64; the kernel's float32 sums may differ by
    its rounding_bound ((blocks + 16) unit roundoffs of sum |terms|), per output element."""
    isa = _isa(isa)
    for k in _ks(qtype):
        for n in COLUMNS:
            x, packed, y_int, rounding, _, _ = _case(qtype, k, n)
            for m in ROWS:
                y = _cpu_kernels.gguf_mm(x[:m], packed, qtype, n, isa=isa).double().numpy()
                err = np.abs(y - y_int[:m])
                assert (err <= rounding[:m]).all(), (k, n, m, (err - rounding[:m]).max())


def largest_code_blocks(qtype: Q, rows: int, cols: int) -> np.ndarray:
    """Blocks whose every code (and K-quant sub-block scale) byte is 0xff: the largest
    code of each type, so that a kernel summing products in narrow lanes meets its worst
    case; the fp16 scales stay finite."""
    blocks = random_blocks(qtype, rows, cols, np.random.default_rng(int(qtype)))
    block_bytes = GGML_QUANT_SIZES[qtype][1]
    fp16 = [o + i for o in FP16_FIELDS[qtype] for i in (0, 1)]
    codes = [i for i in range(block_bytes) if i not in fp16]
    view = blocks.reshape(-1, block_bytes)
    view[:, codes] = 0xFF
    return blocks


@pytest.mark.parametrize("isa", ALL_ISAS)
@pytest.mark.parametrize("qtype", SUPPORTED_TYPES, ids=lambda t: t.name)
def test_gguf_mm_is_exact_at_the_largest_codes(qtype: Q, isa: str) -> None:
    """Every code at its largest against x rows whose every 8-bit code is +127 or -127: the
    largest sums a sub-group's products make (AVX2's maddubs adds pairs of them in int16
    lanes, saturating), against the reference's integer arithmetic."""
    isa = _isa(isa)
    k, n = _ks(qtype)[-1], 33
    qweight = largest_code_blocks(qtype, n, k)
    x = np.stack([np.full(k, 3.0), np.full(k, -0.5), np.tile([1.0, -1.0], k // 2)])
    x = x.astype(np.float32)
    y_int, rounding = gguf_gemm(x, qweight, qtype)
    packed = _cpu_kernels.gguf_pack(torch.from_numpy(qweight), qtype)
    y = _cpu_kernels.gguf_mm(torch.from_numpy(x), packed, qtype, n, isa=isa).double().numpy()
    assert (np.abs(y - y_int) <= rounding).all(), np.abs(y - y_int).max()


@pytest.mark.parametrize("isa", ALL_ISAS)
@pytest.mark.parametrize("qtype", SUPPORTED_TYPES, ids=lambda t: t.name)
def test_gguf_mm_is_within_the_activation_error_of_the_float_product(qtype: Q, isa: str) -> None:
    """Reference: x @ gguf.quants.dequantize(W)^T in float64. Quantizing x to 8 bits moves
    each element by |x - d q| <= d / 2 = amax_block / 254 (times 1 + 1e-4 for d and 1 / d
    being float32), so per output element |y - y_ref| <= sum over blocks of amax_block / 254
    * sum |w| in the block, plus the kernel's float rounding (rounding_bound, and 2^-22 sum
    |x w| for the weight scales' products)."""
    isa = _isa(isa)
    for k in _ks(qtype):
        for n in COLUMNS:
            x, packed, _, _, y_float, bound = _case(qtype, k, n)
            for m in ROWS:
                y = _cpu_kernels.gguf_mm(x[:m], packed, qtype, n, isa=isa).double().numpy()
                err = np.abs(y - y_float[:m])
                assert (err <= bound[:m]).all(), (k, n, m, (err - bound[:m]).max())


@pytest.mark.parametrize("isa", ALL_ISAS)
@pytest.mark.parametrize("qtype", SUPPORTED_TYPES, ids=lambda t: t.name)
def test_gguf_mm_rows_do_not_depend_on_their_batch(qtype: Q, isa: str) -> None:
    """Reference: the row alone (M = 1). The same row at every position of batches of 1 to
    300 rows of other random values gives the same bits: the kernel sums each output in one
    order whatever its tile of rows and columns (csrc/gguf_packed.h)."""
    isa = _isa(isa)
    k, n = _ks(qtype)[0] if GGML_QUANT_SIZES[qtype][0] == 256 else 96, 67
    x, packed, *_ = _case(qtype, k, n)
    alone = _cpu_kernels.gguf_mm(x[5:6], packed, qtype, n, isa=isa)
    others = torch.randn(300, k) * 3
    for m in range(1, 301):
        batch = others[:m].clone()
        at = 7 * m // 11
        batch[at] = x[5]
        y = _cpu_kernels.gguf_mm(batch, packed, qtype, n, isa=isa)
        assert torch.equal(y[at], alone[0]), (m, at)


@pytest.mark.parametrize("qtype", SUPPORTED_TYPES, ids=lambda t: t.name)
def test_gguf_mm_builds_agree_bit_for_bit(qtype: Q) -> None:
    """Reference: the portable build. Integer dots are exact and the float steps are the same
    operations in the same order (fused multiply-adds included), so every build gives the
    same bits."""
    k, n = _ks(qtype)[-1], 67
    x, packed, *_ = _case(qtype, k, n)
    expected = _cpu_kernels.gguf_mm(x[:9], packed, qtype, n, isa="portable")
    for isa in _cpu_kernels.gguf_isas():
        assert torch.equal(_cpu_kernels.gguf_mm(x[:9], packed, qtype, n, isa=isa), expected), isa


@pytest.mark.parametrize("qtype", SUPPORTED_TYPES, ids=lambda t: t.name)
def test_gguf_mm_adds_the_bias(qtype: Q) -> None:
    """Reference: the kernel without bias, plus the bias (one float32 add)."""
    x, packed, *_ = _case(qtype, _ks(qtype)[-1], 67)
    bias = torch.randn(67)
    expected = _cpu_kernels.gguf_mm(x[:5], packed, qtype, 67) + bias
    assert torch.equal(_cpu_kernels.gguf_mm(x[:5], packed, qtype, 67, bias), expected)


@pytest.mark.parametrize("qtype", (Q.Q4_1, Q.Q6_K), ids=lambda t: t.name)
def test_gguf_mm_on_bfloat16_is_the_float32_result_rounded(qtype: Q) -> None:
    """Reference: the float32 kernel on x widened from bfloat16 (exact), plus the bias
    widened, rounded to bfloat16 as torch rounds."""
    x, packed, *_ = _case(qtype, _ks(qtype)[-1], 67)
    xb, bias = x[:7].bfloat16(), torch.randn(67).bfloat16()
    expected = (_cpu_kernels.gguf_mm(xb.float(), packed, qtype, 67) + bias.float()).bfloat16()
    y = _cpu_kernels.gguf_mm(xb, packed, qtype, 67, bias)
    assert y.dtype == torch.bfloat16 and torch.equal(y, expected)


@pytest.mark.parametrize("qtype", SUPPORTED_TYPES, ids=lambda t: t.name)
def test_dequantizing_blocks_or_packed_rows_is_bit_equal_to_gguf(qtype: Q) -> None:
    """Reference: gguf.quants.dequantize, compared bit for bit, of the blocks (gguf_dequantize)
    and of rows read back from the packed layout (gguf_unpack_rows, any order, repeated);
    scales include zero, negative zero and subnormal fp16 values, which convert exactly."""
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(int(qtype))
    qweight = random_blocks(qtype, 19, block_size * 5, rng)
    blocks = qweight.reshape(-1, type_size)
    offset = 208 if qtype == Q.Q6_K else 0
    for i, bits in enumerate((0x0000, 0x8000, 0x0001, 0x83FF, 0x0400)):
        blocks[i, offset : offset + 2] = np.array([bits], np.uint16).view(np.uint8)
    expected = dequantize(qweight, qtype).view(np.uint32)
    out = _cpu_kernels.gguf_dequantize(torch.from_numpy(qweight), qtype).numpy()
    np.testing.assert_array_equal(out.view(np.uint32), expected)
    packed = _cpu_kernels.gguf_pack(torch.from_numpy(qweight), qtype)
    rows = torch.tensor([18, 0, 3, 3, 16, 7])
    unpacked = _cpu_kernels.gguf_unpack_rows(packed, qtype, 19, block_size * 5, rows).numpy()
    np.testing.assert_array_equal(unpacked.view(np.uint32), expected[rows.numpy()])


@pytest.mark.parametrize("qtype", SUPPORTED_TYPES, ids=lambda t: t.name)
def test_packed_weights_take_about_the_bytes_of_their_blocks(qtype: Q) -> None:
    """16 rows of 2 blocks' worth of K pack into their blocks' bytes (K-quants: 2.8% more for
    Q4_K, 2.3% for Q5_K, their per-column super-block scales), padded to 64 bytes a group."""
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    groups, group_bytes = _cpu_kernels.gguf_packed_shape(qtype, 64, 2 * block_size)
    assert groups == 4
    assert 16 * 2 * type_size <= group_bytes <= 16 * 2 * type_size * 1.03 + 63


def test_gguf_isas_are_the_supported_ones_best_first() -> None:
    """The portable path runs everywhere; the list keeps ALL_ISAS' order."""
    isas = _cpu_kernels.gguf_isas()
    assert isas[-1] == "portable"
    assert list(isas) == [name for name in ALL_ISAS if name in isas]


QW = torch.from_numpy(random_blocks(Q.Q4_1, 5, 64, np.random.default_rng(0)))  # [5, 40]
PACKED = _cpu_kernels.gguf_pack(QW, Q.Q4_1) if _cpu_kernels.available() else None


def _mm(**override: object) -> torch.Tensor:
    args = {"x": torch.randn(2, 64), "packed": PACKED, "qtype": Q.Q4_1, "n": 5}
    return _cpu_kernels.gguf_mm(**{**args, "bias": torch.randn(5), **override})


BAD_CALLS: dict[str, tuple[Callable[[], object], str]] = {
    "pack float32": (
        lambda: _cpu_kernels.gguf_pack(QW.float(), Q.Q4_1),
        r"gguf_pack: qweight must be a contiguous uint8 CPU tensor .* got float32",
    ),
    "pack 1-D": (lambda: _cpu_kernels.gguf_pack(QW.flatten(), Q.Q4_1), "qweight must be"),
    "pack rows not whole blocks": (
        lambda: _cpu_kernels.gguf_pack(QW[:, :30].contiguous(), Q.Q4_1),
        "qweight rows of 30 bytes are not whole Q4_1 blocks of 20 bytes",
    ),
    "qtype unsupported": (
        lambda: _mm(qtype=Q.Q2_K),
        "gguf_mm: qtype .*Q2_K.* is not one of the supported GGUF types Q4_0=2, Q4_1=3",
    ),
    "qtype not an int": (lambda: _mm(qtype="Q4_1"), "qtype 'Q4_1' is not one of"),
    "packed of another type": (lambda: _mm(qtype=Q.Q8_0), r"packed must .*\(Q8_0, N=5, K=64\)"),
    "packed of another N": (lambda: _mm(n=17), r"packed must .* = \[2, "),
    "packed float32": (lambda: _mm(packed=PACKED.float()), "packed must be a contiguous uint8"),
    "x of another K": (lambda: _mm(x=torch.randn(2, 96)), r"packed must .* N=5, K=96"),
    "x of part of a block": (lambda: _mm(x=torch.randn(2, 40)), "K = 40 is not whole blocks"),
    "x float64": (lambda: _mm(x=torch.randn(2, 64).double()), "x must be .* float32"),
    "x 3-D": (lambda: _mm(x=torch.randn(1, 2, 64)), r"x must be .* \[M, K\]"),
    "x strided": (lambda: _mm(x=torch.randn(64, 2).t()), "x must be a contiguous"),
    "bias of another size": (lambda: _mm(bias=torch.randn(4)), r"bias must .* = \[5\]"),
    "bias of another dtype": (
        lambda: _mm(bias=torch.randn(5).bfloat16()),
        "bias must be a contiguous float32",
    ),
    "isa unknown": (lambda: _mm(isa="neon"), "isa 'neon' is not one of this CPU's"),
    "unpack a row out of range": (
        lambda: _cpu_kernels.gguf_unpack_rows(PACKED, Q.Q4_1, 5, 64, torch.tensor([0, 5])),
        r"rows\[1\] = 5 is outside \[0, 5\)",
    ),
    "unpack rows int32": (
        lambda: _cpu_kernels.gguf_unpack_rows(PACKED, Q.Q4_1, 5, 64, torch.tensor([0]).int()),
        "rows must be a contiguous int64",
    ),
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


def test_the_valid_calls_above_run() -> None:
    assert _mm().shape == (2, 5)
    assert _cpu_kernels.gguf_unpack_rows(PACKED, Q.Q4_1, 5, 64, torch.tensor([4])).shape == (1, 64)
    assert _cpu_kernels.gguf_dequantize(QW, Q.Q4_1).shape == (5, 64)


def test_empty_shapes() -> None:
    """No rows of x, or a weight of no rows, give empty outputs."""
    assert _mm(x=torch.randn(0, 64)).shape == (0, 5)
    empty = _cpu_kernels.gguf_pack(QW[:0], Q.Q4_1)
    assert empty.shape[0] == 0
    assert _cpu_kernels.gguf_mm(torch.randn(3, 64), empty, Q.Q4_1, 0).shape == (3, 0)
    assert _cpu_kernels.gguf_dequantize(QW[:0], Q.Q4_1).shape == (0, 64)
