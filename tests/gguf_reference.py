"""The quantized matmul's arithmetic in numpy, the reference of csrc/gguf_mm.c.

Each x row is quantized to 8-bit blocks of 32 (d = amax / 127, q = round-half-even(x * (1 /
d)) in float32); every weight type is read as 32-element blocks of integer codes u with an
offset o, a float32 scale per 16 or 32 elements and a float32 min per 32 (`weight_blocks`), so
that element i is scale * (u - o) + min. Then

    y = sum over blocks b of  scale_b * d_b * dot(u_b - o, q_b)  +  min_b * (d_b * sum(q_b))

with the integer dots exact and the sum in float64 of the float32 factors the kernel uses; the
kernel sums in float32, so it agrees to within `rounding_bound`.
"""

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

Q = GGMLQuantizationType
QK = 32


def quantize_activations(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x float32 [M, K] -> (q int64 [M, K / 32, 32], d float32 [M, K / 32])."""
    blocks = x.astype(np.float32).reshape(x.shape[0], -1, QK)
    d = np.abs(blocks).max(axis=-1) / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    q = np.rint(blocks * inv[..., None]).astype(np.int64)
    return q, d.astype(np.float32)


def _f16(raw: np.ndarray) -> np.ndarray:
    """[n, 2] bytes -> float32 [n]."""
    return np.ascontiguousarray(raw).view(np.float16).astype(np.float32)[:, 0]


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[n, 16] -> [n, 32]: the low nibbles, then the high ones."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.int64)


def _fifth_bits(qh: np.ndarray) -> np.ndarray:
    """[n, 4] (a little-endian uint32) -> [n, 32]: bit i as 16 or 0."""
    return np.unpackbits(qh, axis=-1, bitorder="little").astype(np.int64) << 4


def _k_scale_min(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 bytes [n, 12] -> 6-bit scales and mins [n, 8]."""
    s = s.astype(np.int64)
    sc = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 15) | (s[:, 0:4] >> 6) << 4], axis=-1)
    mn = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | (s[:, 4:8] >> 6) << 4], axis=-1)
    return sc, mn


def weight_blocks(
    qweight: np.ndarray, qtype: int
) -> tuple[np.ndarray, int, np.ndarray, np.ndarray]:
    """uint8 [N, bytes] -> (codes int64 [N, K / 32, 32], offset, scale float32 [N, K / 32, 2]
    (one per 16 elements), min float32 [N, K / 32])."""
    n = qweight.shape[0]
    block_size, type_size = GGML_QUANT_SIZES[Q(qtype)]
    b = qweight.reshape(-1, type_size)
    zero = np.zeros(b.shape[0], np.float32)
    if qtype in (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0):
        d = _f16(b[:, 0:2])
        if qtype == Q.Q8_0:
            codes, offset, mn = b[:, 2:].view(np.int8).astype(np.int64), 0, zero
        elif qtype in (Q.Q4_0, Q.Q4_1):
            codes, offset = _nibbles(b[:, -16:]), 8 if qtype == Q.Q4_0 else 0
            mn = _f16(b[:, 2:4]) if qtype == Q.Q4_1 else zero
        else:
            qh = b[:, 2:6] if qtype == Q.Q5_0 else b[:, 4:8]
            codes, offset = _nibbles(b[:, -16:]) | _fifth_bits(qh), 16 if qtype == Q.Q5_0 else 0
            mn = _f16(b[:, 2:4]) if qtype == Q.Q5_1 else zero
        scale = np.repeat(d[:, None], 2, axis=1)
    elif qtype in (Q.Q4_K, Q.Q5_K):
        d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
        sc, m6 = _k_scale_min(b[:, 4:16])
        ql = b[:, 16:144] if qtype == Q.Q4_K else b[:, 48:176]
        ql = ql.reshape(-1, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
        codes = (ql & 0x0F).reshape(-1, 8, 32).astype(np.int64)
        if qtype == Q.Q5_K:
            bits = b[:, 16:48].reshape(-1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
            codes |= (bits & 1).astype(np.int64) << 4
        offset = 0
        scale = np.repeat((d[:, None] * sc.astype(np.float32))[..., None], 2, axis=-1)
        mn = -(dmin[:, None] * m6.astype(np.float32))
    else:
        ql = b[:, 0:128].reshape(-1, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
        qh = b[:, 128:192].reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(
            1, 1, 4, 1
        )
        low = (ql & 0x0F).reshape(-1, 8, 32).astype(np.int64)
        codes, offset = low | ((qh & 3).reshape(-1, 8, 32).astype(np.int64) << 4), 32
        d = _f16(b[:, 208:210])
        scale = d[:, None] * b[:, 192:208].view(np.int8).astype(np.float32)  # [n, 16]
        mn = np.zeros((b.shape[0], 8), np.float32)
    blocks = codes.size // (n * QK)
    return (
        codes.reshape(n, blocks, QK),
        offset,
        scale.astype(np.float32).reshape(n, blocks, 2),
        mn.astype(np.float32).reshape(n, blocks),
    )


def _terms(
    x: np.ndarray, qweight: np.ndarray, qtype: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The per-block terms [M, N, K / 32] of y, scale * d * dot and min * d * sum, and the
    first with |products| summed instead of products (its size however the sum is split)."""
    q, d = quantize_activations(x)
    codes, offset, scale, mn = weight_blocks(qweight, qtype)
    signed = (codes - offset).reshape(*codes.shape[:2], 2, 16).astype(np.float64)  # [N, B, 2, 16]
    q16 = q.reshape(*q.shape[:2], 2, 16).astype(np.float64)  # [M, B, 2, 16]
    # integer dots per half block, exact in float64: [B, 2, N, M]
    halves = np.matmul(signed.transpose(1, 2, 0, 3), q16.transpose(1, 2, 3, 0))
    sizes = np.matmul(np.abs(signed).transpose(1, 2, 0, 3), np.abs(q16).transpose(1, 2, 3, 0))
    scale64 = scale.astype(np.float64).transpose(1, 2, 0)[..., None]  # [B, 2, N, 1]
    d64 = d.astype(np.float64).T[:, None, None, :]  # [B, 1, 1, M]
    dot_term = (halves * scale64 * d64).sum(1).transpose(2, 1, 0)  # [M, N, B]
    dot_size = (sizes * np.abs(scale64) * d64).sum(1).transpose(2, 1, 0)
    ds = (d * q.sum(-1).astype(np.float32)).astype(np.float64)  # the kernel's float32 d * sum
    min_term = mn.astype(np.float64)[None] * ds[:, None, :]
    return dot_term, min_term, dot_size


def gguf_gemm(x: np.ndarray, qweight: np.ndarray, qtype: int) -> tuple[np.ndarray, np.ndarray]:
    """(y float64 [M, N], rounding_bound [M, N]): the exact sum of the float32 factors, and
    how far a float32 sum of them may stray: (blocks + 16) unit roundoffs of the sum of
    |products| (one rounding per product and per accumulation step along the longest chain,
    for partial sums split any way)."""
    dot_term, min_term, dot_size = _terms(x, qweight, qtype)
    y = dot_term.sum(-1) + min_term.sum(-1)
    magnitude = dot_size.sum(-1) + np.abs(min_term).sum(-1)
    return y, (dot_term.shape[-1] + 16) * 2.0**-24 * magnitude


def activation_error_bound(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """[M, N]: sum over blocks of amax_block / 254 * sum |w| in the block, the most that
    quantizing x to 8 bits (|x - d q| <= d / 2, d = amax / 127) moves x @ weight.T."""
    amax = np.abs(x.reshape(x.shape[0], -1, QK)).max(-1).astype(np.float64)  # [M, B]
    w_abs = np.abs(weight.reshape(weight.shape[0], -1, QK)).sum(-1).astype(np.float64)
    return amax @ w_abs.T / 254
