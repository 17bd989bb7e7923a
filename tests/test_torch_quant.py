"""pagedllm._torch_quant against gguf.quants, the reference for every GGUF block layout."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

from pagedllm import _torch_quant
from pagedllm._torch_quant import (
    SUPPORTED_TYPES,
    dequantize,
    gguf_linear,
    quantize_q8_0,
    row_bytes,
    row_elements,
)
from tests import gguf_blocks
from tests.devices import needs_cuda
from tests.gguf_blocks import random_blocks

Q = GGMLQuantizationType
TYPES = pytest.mark.parametrize("qtype", SUPPORTED_TYPES, ids=lambda t: t.name)


def _blocks(qtype: GGMLQuantizationType, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """uint8 [*shape[:-1], bytes]: random valid blocks for rows of shape[-1] elements."""
    rows = int(np.prod(shape[:-1]))
    blocks = random_blocks(qtype, rows, shape[-1], np.random.default_rng(seed))
    return blocks.reshape(*shape[:-1], -1)


def _gguf_dequantize(qweight: np.ndarray, qtype: GGMLQuantizationType) -> torch.Tensor:
    return torch.from_numpy(quants.dequantize(qweight, qtype))


def _gguf_q8_0(weight: np.ndarray) -> torch.Tensor:
    with np.errstate(all="ignore"):  # gguf's 1 / d overflows for tiny blocks
        return torch.from_numpy(quants.quantize(weight, Q.Q8_0))


def _weights(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """float32 rows of normal noise, each at its own scale between 1e-44 (subnormal; below
    ~3.7e-37 gguf's 1 / d overflows) and 1e30 (d beyond fp16); every 5th row from the 4th is
    all zeros, every 7th from the 2nd is zero past its first block."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    rows = x.reshape(-1, shape[-1])
    rows *= (10.0 ** rng.uniform(-44, 30, (rows.shape[0], 1))).astype(np.float32)
    rows[3::5] = 0
    rows[1::7, 32:] = 0
    return x


def test_supported_types_are_the_tested_ones():
    """The types with a dequantizer are the ones tests/gguf_blocks.py draws blocks for."""
    assert set(SUPPORTED_TYPES) == set(gguf_blocks.SUPPORTED_TYPES)


@TYPES
def test_row_sizes_match_gguf_shapes(qtype):
    """row_bytes/row_elements agree with gguf.quants' byte-shape conversions."""
    block_size, _ = GGML_QUANT_SIZES[qtype]
    k = 3 * block_size
    (nbytes,) = quants.quant_shape_to_byte_shape((k,), qtype)
    assert row_bytes(qtype, k) == nbytes
    assert row_elements(qtype, nbytes) == k
    assert row_bytes(int(qtype), 0) == 0


@TYPES
@pytest.mark.parametrize("shape", [(2,), (1, 1), (1, 3), (5, 2), (3, 4, 2)], ids=str)
def test_dequantize_matches_gguf_exactly(qtype, shape):
    """Bit-equal to gguf.quants.dequantize on random valid blocks; shape is (*rows, blocks)."""
    block_size, _ = GGML_QUANT_SIZES[qtype]
    qweight = _blocks(qtype, (*shape[:-1], shape[-1] * block_size))
    out = dequantize(torch.from_numpy(qweight), qtype)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, _gguf_dequantize(qweight, qtype), rtol=0, atol=0)


@TYPES
def test_dequantize_reads_unaligned_views(qtype):
    """A view at an odd byte offset (fp16 fields not 2-byte aligned) reads like a copy."""
    qweight = torch.from_numpy(_blocks(qtype, (2, GGML_QUANT_SIZES[qtype][0])))
    buffer = torch.zeros(qweight.numel() + 1, dtype=torch.uint8)
    view = buffer[1:].view(qweight.shape)
    view.copy_(qweight)
    torch.testing.assert_close(dequantize(view, qtype), dequantize(qweight, qtype), rtol=0, atol=0)


@pytest.mark.parametrize("shape", [(64,), (40, 96), (2, 3, 64)], ids=str)
def test_quantize_q8_0_matches_gguf_bytes(shape):
    """Byte-equal to gguf.quants.quantize(x, Q8_0) over magnitudes 1e-44..1e30 and zero rows."""
    weight = _weights(shape)
    out = quantize_q8_0(torch.from_numpy(weight))
    assert out.dtype == torch.uint8
    torch.testing.assert_close(out, _gguf_q8_0(weight), rtol=0, atol=0)


def test_quantize_q8_0_rounds_halves_away_from_zero():
    """gguf (like C roundf) rounds x / d = k + 0.5 away from zero, unlike torch.round."""
    block = np.array([127.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5] + [0.0] * 25, np.float32)
    out = quantize_q8_0(torch.from_numpy(block))
    torch.testing.assert_close(out, _gguf_q8_0(block), rtol=0, atol=0)
    assert out[2:9].view(torch.int8).tolist() == [127, 1, -1, 2, -2, 3, -3]


# amax / 127 here is 1 ulp off amax * (1 / 127), which moves x * (1 / d) of the other values
# across a rounding boundary: only gguf's true division gives its bytes.
NEAR_TIES = np.array([1.4045519, 0.71333534, 0.0055297315, 0.6248597] + [0.0] * 28, np.float32)


def test_quantize_q8_0_divides_amax_by_127():
    """gguf computes d = amax / 127 by true division; multiplying by 1 / 127 changes q."""
    out = quantize_q8_0(torch.from_numpy(NEAR_TIES))
    torch.testing.assert_close(out, _gguf_q8_0(NEAR_TIES), rtol=0, atol=0)
    assert out[2:6].view(torch.int8).tolist() == [127, 64, 0, 56]


def test_quantize_q8_0_in_chunks(monkeypatch):
    """Rows split over several chunks, the last one short, give gguf's bytes."""
    monkeypatch.setattr(_torch_quant, "_QUANTIZE_CHUNK_ELEMENTS", 3 * 64)
    weight = _weights((10, 64), seed=1)
    out = quantize_q8_0(torch.from_numpy(weight))
    torch.testing.assert_close(out, _gguf_q8_0(weight), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_quantize_q8_0_of_half_weights(dtype):
    """A 16-bit weight quantizes as gguf quantizes its float32 values."""
    weight = torch.randn(6, 128, generator=torch.Generator().manual_seed(0)).to(dtype)
    expected = _gguf_q8_0(weight.float().numpy())
    torch.testing.assert_close(quantize_q8_0(weight), expected, rtol=0, atol=0)


def test_quantize_q8_0_round_trip_error():
    """Formula: |x - q * d| <= d / 2 for d = amax / 127 (exact, float64), and storing d as
    fp16 adds at most |q| <= 127 times its rounding (2^-11 relative)."""
    rng = np.random.default_rng(2)
    scales = (10.0 ** rng.uniform(-2, 4, (64, 1))).astype(np.float32)
    weight = torch.from_numpy(rng.standard_normal((64, 256)).astype(np.float32) * scales)
    blocks = quantize_q8_0(weight).view(64, 8, 34)
    q = blocks[..., 2:].view(torch.int8).double()
    x = weight.view(64, 8, 32).double()
    d = x.abs().amax(-1, keepdim=True) / 127
    assert ((x - q * d).abs() <= d / 2 * (1 + 1e-6)).all()
    err = (dequantize(blocks.view(64, -1), Q.Q8_0).view(64, 8, 32) - x).abs()
    assert (err <= d / 2 + 127 * d * 2.0**-11).all()


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_K, Q.Q6_K], ids=lambda t: t.name)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_bias", [False, True])
def test_gguf_linear_is_dequantize_then_linear(qtype, dtype, with_bias):
    """Equal to F.linear(x, dequantize(qweight).to(x.dtype), bias)."""
    qweight = torch.from_numpy(_blocks(qtype, (24, 256)))
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 256, generator=gen).to(dtype)
    bias = torch.randn(24, generator=gen).to(dtype) if with_bias else None
    out = gguf_linear(x, qweight, qtype, bias)
    expected = F.linear(x, dequantize(qweight, qtype).to(dtype), bias)
    assert out.shape == (2, 3, 24) and out.dtype == dtype
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


@pytest.mark.parametrize("qtype", [Q.F32, Q.F16, Q.Q2_K, Q.IQ4_NL, 999])
def test_unsupported_types_are_refused(qtype):
    with pytest.raises(ValueError, match="supported: Q4_0=2"):
        dequantize(torch.zeros(1, 256, dtype=torch.uint8), qtype)
    with pytest.raises(ValueError, match="no block dequantizer"):
        row_bytes(qtype, 256)


def test_partial_blocks_are_refused():
    with pytest.raises(ValueError, match="Q4_K rows hold whole blocks of 144 bytes, got 150"):
        dequantize(torch.zeros(2, 150, dtype=torch.uint8), Q.Q4_K)
    with pytest.raises(ValueError, match="whole blocks of 32 elements, got 48"):
        row_bytes(Q.Q8_0, 48)
    with pytest.raises(ValueError, match="whole blocks of 32 elements, got 48"):
        quantize_q8_0(torch.zeros(3, 48))


def test_wrong_dtypes_are_refused():
    with pytest.raises(TypeError, match="uint8"):
        dequantize(torch.zeros(1, 34, dtype=torch.int8), Q.Q8_0)
    with pytest.raises(TypeError, match="floating"):
        quantize_q8_0(torch.zeros(1, 32, dtype=torch.int32))


@needs_cuda
@TYPES
def test_dequantize_on_cuda_matches_gguf(qtype):
    """On CUDA, bit-equal to gguf.quants.dequantize as on the CPU."""
    qweight = _blocks(qtype, (3, 4, 2 * GGML_QUANT_SIZES[qtype][0]))
    out = dequantize(torch.from_numpy(qweight).cuda(), qtype)
    assert out.is_cuda
    torch.testing.assert_close(out.cpu(), _gguf_dequantize(qweight, qtype), rtol=0, atol=0)


@needs_cuda
def test_quantize_q8_0_on_cuda_matches_gguf_bytes():
    """On CUDA, byte-equal to gguf.quants.quantize as on the CPU, near ties included."""
    weight = _weights((40, 96))
    weight[0, :32] = NEAR_TIES
    out = quantize_q8_0(torch.from_numpy(weight).cuda())
    torch.testing.assert_close(out.cpu(), _gguf_q8_0(weight), rtol=0, atol=0)
