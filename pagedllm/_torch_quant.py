"""The torch definitions of GGUF block quantization, on any device.

A quantized weight is `qweight`, uint8 [..., K / block_size * type_size], each row the GGUF
blocks of that row as they lie in the file, plus `qtype`, a `gguf.GGMLQuantizationType`
(or its int). The layouts follow `gguf.quants`; dequantization does the same float32
operations in the same order, so it is bit-exact against `gguf.quants.dequantize`. This is
the reference the quantized kernels are tested against and the fallback where they do not
apply. Nothing here computes with numpy; gguf is imported only for its size table.

Blocks are read as little-endian (GGUF's byte order, and that of every supported host).
"""

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

Q = GGMLQuantizationType
_QUANTIZE_CHUNK_ELEMENTS = 1 << 20
"""quantize_q8_0 works on about this many elements at a time (~4 MiB per float32 temporary)."""


def _f16(field: torch.Tensor) -> torch.Tensor:
    """A 2-byte fp16 field [n, 2] of blocks -> float32 [n, 1]."""
    return field.contiguous().view(torch.float16).float()


def _unpack(x: torch.Tensor, shifts: range | tuple[int, ...], mask: int, dim: int) -> torch.Tensor:
    """uint8 x [..., L] -> [..., S, L] (dim=-2) or [..., L, S] (dim=-1): (x >> shift) & mask for
    each of the S shifts."""
    return torch.stack([(x >> s) & mask for s in shifts], dim=dim)


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """Q4_0/Q4_1/Q5_0/Q5_1 quants [n, 16] -> [n, 32]: the low nibbles, then the high ones."""
    return _unpack(qs, (0, 4), 0x0F, dim=-2).flatten(1)


def _fifth_bits(qh: torch.Tensor) -> torch.Tensor:
    """Q5_0/Q5_1 qh [n, 4] (a little-endian uint32) -> [n, 32]: bit i << 4 for element i."""
    return _unpack(qh, range(8), 0x01, dim=-1).flatten(1) << 4


def _q4_0(blocks: torch.Tensor) -> torch.Tensor:
    d, qs = blocks.split([2, 16], dim=-1)
    return _f16(d) * (_nibbles(qs).float() - 8)


def _q4_1(blocks: torch.Tensor) -> torch.Tensor:
    d, m, qs = blocks.split([2, 2, 16], dim=-1)
    return _f16(d) * _nibbles(qs).float() + _f16(m)


def _q5_0(blocks: torch.Tensor) -> torch.Tensor:
    d, qh, qs = blocks.split([2, 4, 16], dim=-1)
    return _f16(d) * ((_nibbles(qs) | _fifth_bits(qh)).float() - 16)


def _q5_1(blocks: torch.Tensor) -> torch.Tensor:
    d, m, qh, qs = blocks.split([2, 2, 4, 16], dim=-1)
    return _f16(d) * (_nibbles(qs) | _fifth_bits(qh)).float() + _f16(m)


def _q8_0(blocks: torch.Tensor) -> torch.Tensor:
    d, qs = blocks.split([2, 32], dim=-1)
    return qs.contiguous().view(torch.int8).float() * _f16(d)


def _k_scale_min(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K's 12 packed bytes [n, 12] -> 6-bit (scale, min) [n, 8] of the 8 sub-blocks.

    Bytes 0-3 hold scales 0-3 in their low 6 bits, bytes 4-7 mins 0-3; bytes 8-11 hold the low
    4 bits of scales 4-7 (low nibble) and mins 4-7 (high nibble), whose top 2 bits are the top
    bits of bytes 0-3 (scales) and 4-7 (mins).
    """
    sc, mn, low = scales.reshape(-1, 3, 4).unbind(1)  # each [n, 4]
    scale = torch.cat((sc & 0x3F, (low & 0x0F) | ((sc >> 2) & 0x30)), dim=-1)
    min_ = torch.cat((mn & 0x3F, (low >> 4) | ((mn >> 2) & 0x30)), dim=-1)
    return scale, min_


def _k_affine(head: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Q4_K/Q5_K: head [n, 16] (d, dmin, packed scales) and quants q [n, 8, 32] -> [n, 256],
    each sub-block j being d * scale_j * q - dmin * min_j."""
    d, dmin, scales = head.split([2, 2, 12], dim=-1)
    scale, min_ = _k_scale_min(scales)
    d = (_f16(d) * scale.float()).unsqueeze(-1)  # [n, 8, 1]
    dm = (_f16(dmin) * min_.float()).unsqueeze(-1)
    return (d * q.float() - dm).flatten(1)


def _k_nibbles(qs: torch.Tensor) -> torch.Tensor:
    """Q4_K/Q5_K quants [n, 128] -> [n, 8, 32]: 32 bytes give the low nibbles of one sub-block,
    then their high nibbles the next."""
    return _unpack(qs.reshape(-1, 4, 32), (0, 4), 0x0F, dim=-2).reshape(-1, 8, 32)


def _q4_k(blocks: torch.Tensor) -> torch.Tensor:
    head, qs = blocks.split([16, 128], dim=-1)
    return _k_affine(head, _k_nibbles(qs))


def _q5_k(blocks: torch.Tensor) -> torch.Tensor:
    head, qh, qs = blocks.split([16, 32, 128], dim=-1)
    high = _unpack(qh, range(8), 0x01, dim=-2)  # [n, 8, 32]: bit j is sub-block j's
    return _k_affine(head, _k_nibbles(qs) | (high << 4))


def _q6_k(blocks: torch.Tensor) -> torch.Tensor:
    ql, qh, scales, d = blocks.split([128, 64, 16, 2], dim=-1)
    low = _unpack(ql.reshape(-1, 2, 64), (0, 4), 0x0F, dim=-2).reshape(-1, 8, 32)
    high = _unpack(qh.reshape(-1, 2, 32), (0, 2, 4, 6), 0x03, dim=-2).reshape(-1, 8, 32)
    q = ((low | (high << 4)).float() - 32).reshape(-1, 16, 16)
    scale = _f16(d) * scales.contiguous().view(torch.int8).float()  # [n, 16]
    return (scale.unsqueeze(-1) * q).flatten(1)


_DEQUANTIZE_BLOCKS: dict[int, Callable[[torch.Tensor], torch.Tensor]] = {
    Q.Q4_0: _q4_0,
    Q.Q4_1: _q4_1,
    Q.Q5_0: _q5_0,
    Q.Q5_1: _q5_1,
    Q.Q8_0: _q8_0,
    Q.Q4_K: _q4_k,
    Q.Q5_K: _q5_k,
    Q.Q6_K: _q6_k,
}
"""qtype -> blocks uint8 [n, type_size] -> float32 [n, block_size]."""

SUPPORTED_TYPES: tuple[GGMLQuantizationType, ...] = tuple(_DEQUANTIZE_BLOCKS)
"""The GGUF block types pagedllm keeps quantized."""

BLOCK_SIZES: dict[GGMLQuantizationType, tuple[int, int]] = {
    qtype: GGML_QUANT_SIZES[qtype] for qtype in SUPPORTED_TYPES
}
"""qtype -> (block_size: elements per block, type_size: bytes per block)."""


def _sizes(qtype: int) -> tuple[int, int]:
    if qtype not in BLOCK_SIZES:
        names = ", ".join(f"{t.name}={int(t)}" for t in SUPPORTED_TYPES)
        raise ValueError(f"GGUF type {qtype!r} has no block dequantizer; supported: {names}")
    return BLOCK_SIZES[qtype]


def row_bytes(qtype: int, k: int) -> int:
    """Bytes of a row of k elements of qtype; k must be whole blocks."""
    block_size, type_size = _sizes(qtype)
    if k % block_size:
        raise ValueError(
            f"{Q(qtype).name} rows hold whole blocks of {block_size} elements, got {k} elements"
        )
    return k // block_size * type_size


def row_elements(qtype: int, nbytes: int) -> int:
    """Elements in a row of nbytes of qtype; nbytes must be whole blocks."""
    block_size, type_size = _sizes(qtype)
    if nbytes % type_size:
        raise ValueError(
            f"{Q(qtype).name} rows hold whole blocks of {type_size} bytes, got {nbytes} bytes"
        )
    return nbytes // type_size * block_size


def dequantize(qweight: torch.Tensor, qtype: int) -> torch.Tensor:
    """qweight uint8 [..., bytes] of qtype blocks -> float32 [..., K] on qweight's device,
    bit-equal to gguf.quants.dequantize."""
    if qweight.dtype != torch.uint8 or qweight.dim() == 0:
        raise TypeError(
            f"qweight must be a uint8 tensor [..., bytes], got {qweight.dtype} "
            f"of shape {tuple(qweight.shape)}"
        )
    k = row_elements(qtype, qweight.shape[-1])
    _, type_size = BLOCK_SIZES[qtype]
    values = _DEQUANTIZE_BLOCKS[qtype](qweight.reshape(-1, type_size))
    return values.reshape(*qweight.shape[:-1], k)


def gguf_linear(
    x: torch.Tensor, qweight: torch.Tensor, qtype: int, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x [..., K] @ W.T + bias with W [N, K] dequantized from qweight [N, bytes] into x's
    dtype; the reference and the fallback of the quantized matmul kernels."""
    return F.linear(x, dequantize(qweight, qtype).to(x.dtype), bias)


def quantize_q8_0(weight: torch.Tensor) -> torch.Tensor:
    """float weight [..., K] -> uint8 [..., K / 32 * 34] of Q8_0 blocks, the bytes
    gguf.quants.quantize(weight, Q8_0) gives (and ggml's quantize_row_q8_0_ref).

    Each block of 32 stores d = amax / 127 as fp16, then q = roundf(x * (1 / d)) as int8,
    rounding halves away from zero; d is rounded to fp16 after q is computed, so q is relative
    to the float32 d. Rows are done in chunks of about 1M elements, so the temporaries stay
    small however large the weight.

    Finite weights only: gguf's bytes for inf/NaN depend on numpy's platform casts. A block
    whose amax is below ~3.7e-37 but not 0 has 1 / d = inf, so its roundf gives NaN, which
    numpy's int8 cast (undefined in C) turns into 0 on x86; here it is made 0 explicitly, on
    every device. Its d rounds to fp16 0 anyway, so the block dequantizes to 0 either way.
    """
    if not weight.is_floating_point() or weight.dim() == 0:
        raise TypeError(
            f"weight must be a floating tensor [..., K], got {weight.dtype} "
            f"of shape {tuple(weight.shape)}"
        )
    k = weight.shape[-1]
    nbytes = row_bytes(Q.Q8_0, k)
    rows = weight.reshape(math.prod(weight.shape[:-1]), k)
    out = torch.empty(rows.shape[0], nbytes, dtype=torch.uint8, device=weight.device)
    chunk = max(1, _QUANTIZE_CHUNK_ELEMENTS // max(k, 1))
    for start in range(0, rows.shape[0], chunk):
        out[start : start + chunk] = _quantize_q8_0_rows(rows[start : start + chunk])
    return out.reshape(*weight.shape[:-1], nbytes)


def _quantize_q8_0_rows(rows: torch.Tensor) -> torch.Tensor:
    """rows [R, K] -> uint8 [R, K / 32 * 34]."""
    blocks = rows.float().reshape(rows.shape[0], -1, 32)  # [R, K / 32, 32]
    # The divisor is a tensor on the blocks' device: CUDA turns division by a CPU scalar
    # into multiplication by its reciprocal, which is not bit-equal to gguf's division.
    d = blocks.abs().amax(dim=-1, keepdim=True) / blocks.new_tensor(127.0)
    inv_d = torch.where(d == 0, 0.0, d.reciprocal())
    q = _round_half_away(blocks * inv_d).nan_to_num(nan=0.0)
    packed = torch.cat((d.half().view(torch.uint8), q.to(torch.int8).view(torch.uint8)), dim=-1)
    return packed.flatten(1)


def _round_half_away(x: torch.Tensor) -> torch.Tensor:
    """C roundf (halves away from zero; torch.round goes to even), as gguf's np_roundf
    computes it: floor(|x|) + floor(2 * frac(|x|)), exact in float32 (|x| + 0.5 is not)."""
    a = x.abs()
    whole = a.floor()
    return x.sign() * (whole + (2 * (a - whole)).floor())
