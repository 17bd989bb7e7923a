"""The tensors of one quantized linear layer, read as the checkpoint's format stores them.

Each format keeps a layer `prefix` as a few tensors beside where `prefix.weight` would be:
- GPTQ: qweight int32 [K * bits / 32, N] (codes packed down the input dimension, low
  bits first), qzeros int32 [G, N * bits / 32] (packed along the output dimension; the
  original format stores each zero minus one), scales fp16 [G, N], g_idx int32 [K] (the
  group of each input column; out of order when quantized with act-order).
- AWQ (GEMM): qweight int32 [K, N / 8] and qzeros int32 [G, N / 8], packed along the
  output dimension in the order 0 2 4 6 1 3 5 7; scales fp16 [G, N]; w = s * (c - z).
- compressed-tensors pack-quantized: weight_packed int32 [N, K * bits / 32] (codes stored
  as q + 2^(bits-1)), weight_scale [N, G], weight_shape [2], weight_zero_point int32
  [N * bits / 32, G] when asymmetric (packed down the output dimension), weight_g_idx [K]
  with act-order. naive- / int-quantized: weight int8 [N, K], weight_scale, zero point.
  float-quantized: weight float8_e4m3fn [N, K] and weight_scale (per tensor, row or block).
- fp8: weight float8_e4m3fn [N, K] and weight_scale_inv [ceil(N / bn), ceil(K / bk)]
  (one scale per block; w = weight * weight_scale_inv) or weight_scale per tensor.
"""

import sys
from collections.abc import Callable

import torch

from pagedllm.checkpoint_quant import CheckpointQuant, WeightScheme
from pagedllm.model_loader.group_blocks import GroupQuantized

Get = Callable[[str], torch.Tensor]
Has = Callable[[str], bool]

PRIMARY = {
    "gptq": "qweight",
    "awq": "qweight",
    "compressed-tensors": "weight_packed",
}
"""The tensor that marks a quantized layer, by method; compressed-tensors' naive and float
formats, and fp8, keep `weight` and mark it with a scale beside it."""

PARTS = (
    "qweight",
    "qzeros",
    "scales",
    "g_idx",
    "weight_packed",
    "weight_scale",
    "weight_scale_inv",
    "weight_shape",
    "weight_zero_point",
    "weight_g_idx",
)
"""Tensors read as part of a quantized layer (with its `weight` where it has one)."""

UNUSED_PARTS = (
    "input_scale",
    "activation_scale",
    "input_zero_point",
    "input_global_scale",
    "output_scale",
    "k_scale",
    "v_scale",
    "q_scale",
    "kv_scale",
)
"""Static activation scales (transformers' fp8 names theirs activation_scale) and fp8
KV-cache scales: unused, since the matmuls quantize activations per block themselves (or
not at all, on float weights) and the KV cache stays in the model's dtype."""

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
"""The column of its run of 8 that each of an AWQ word's nibbles holds."""


def is_quantized_layer(quant: CheckpointQuant, prefix: str, get: Get, has: Has) -> bool:
    """Whether `prefix` (a layer's name) holds a quantized weight in this checkpoint."""
    primary = PRIMARY.get(quant.method)
    if primary is not None and has(f"{prefix}.{primary}"):
        return True
    return has(f"{prefix}.weight") and (
        has(f"{prefix}.weight_scale") or has(f"{prefix}.weight_scale_inv")
    )


def unpack(
    packed: torch.Tensor, bits: int, dim: int, order: tuple[int, ...] | None = None
) -> torch.Tensor:
    """int32 words -> uint8 codes, each word's 32 / bits codes low bits first, spread along
    `dim` (0 or 1) of a 2-D tensor; code i of a word goes to place order[i] of its run.

    Along dim 1 the words are read as their little-endian bytes, each byte split in place;
    along dim 0 each shift writes whole rows. Neither makes an int32 temporary of every code
    or writes bytes with a stride, which take several times as long on a 7B model's layers."""
    words = packed.to(torch.int32).contiguous()
    rows, columns = words.shape
    per, mask = 32 // bits, (1 << bits) - 1
    if dim == 1:
        assert sys.byteorder == "little"
        octets = words.view(torch.uint8).reshape(rows, columns, 4, 1)
        shifts = torch.arange(0, 8, bits, dtype=torch.uint8)
        codes = ((octets >> shifts) & mask).reshape(rows, columns, per)
        if order is not None:
            codes = codes[..., sorted(range(per), key=order.__getitem__)]
        return codes.reshape(rows, columns * per)
    codes = torch.empty(rows, per, columns, dtype=torch.uint8)
    for i in range(per):
        codes[:, i if order is None else order[i], :] = (words >> (bits * i)) & mask
    return codes.reshape(rows * per, columns)


def read_layer(
    quant: CheckpointQuant, prefix: str, get: Get, has: Has
) -> GroupQuantized | torch.Tensor:
    """Layer `prefix`'s weight [N, K]: its codes, scales and zeros, or (float formats, a
    layer quantized with act-order) the float32 weight itself."""
    if quant.method == "gptq":
        return _gptq(quant, prefix, get, has)
    if quant.method == "awq":
        return _awq(quant, prefix, get)
    if has(f"{prefix}.weight_packed"):
        return _ct_packed(quant, prefix, get, has)
    weight = get(f"{prefix}.weight")
    if weight.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return _fp8(quant.scheme(prefix), prefix, weight, get, has)
    return _ct_int(quant, prefix, weight, get, has)


def _group_size(scheme: WeightScheme, columns: int) -> int:
    return scheme.group_size or columns


def _in_order(
    codes: torch.Tensor,
    scale: torch.Tensor,
    zero: torch.Tensor,
    scheme: WeightScheme,
    g_idx: torch.Tensor | None,
) -> GroupQuantized | torch.Tensor:
    """The layer as groups of consecutive columns, or its float32 weight where g_idx (from
    act-order quantization) puts columns in groups out of order."""
    n, k = codes.shape
    group = _group_size(scheme, k)
    in_order = torch.arange(k) // group
    if g_idx is not None and not torch.equal(g_idx.to(torch.int64), in_order):
        g_idx = g_idx.to(torch.int64)
        groups = scale.shape[1]
        if g_idx.shape != (k,) or int(g_idx.min()) < 0 or int(g_idx.max()) >= groups:
            raise ValueError(
                f"g_idx of shape {tuple(g_idx.shape)} with groups {int(g_idx.min())} .. "
                f"{int(g_idx.max())} for {k} columns in {groups} groups"
            )
        if scale.shape[0] != n or zero.shape != scale.shape:
            raise ValueError(
                f"scales {tuple(scale.shape)} and zeros {tuple(zero.shape)} for {n} rows"
            )
        return (codes.float() - zero.float()[:, g_idx]) * scale.float()[:, g_idx]
    return GroupQuantized(codes.contiguous(), scale.contiguous(), zero, scheme.bits, group)


def _packed(get: Get, name: str) -> torch.Tensor:
    """A tensor of int32 words (GPTQ's, AWQ's, compressed-tensors' packed codes)."""
    words = get(name)
    if words.dtype != torch.int32 or words.dim() != 2:
        raise ValueError(
            f"{name}: packed codes are 2-D int32 words, got {words.dtype} of shape "
            f"{tuple(words.shape)}"
        )
    return words


def _optional(name: str, get: Get, has: Has) -> torch.Tensor | None:
    return get(name) if has(name) else None


def _add_one_per_field(words: torch.Tensor, bits: int) -> torch.Tensor:
    """GPTQ's original format stores each zero minus one, subtracted from the whole 32-bit
    word (0x11111111 for 4 bits, as GPTQModel writes it), so a zero of 0 borrows from the
    next field; adding the same constant to the word restores every field."""
    ones = sum(1 << shift for shift in range(0, 32, bits))
    return ((words.to(torch.int64) + ones) & 0xFFFFFFFF).to(torch.uint32).view(torch.int32)


def _gptq(quant: CheckpointQuant, prefix: str, get: Get, has: Has) -> GroupQuantized | torch.Tensor:
    scheme = quant.scheme(prefix)
    # codes [N, K] straight from the words [K / per, N] turned [N, K / per]: no byte transpose
    codes = unpack(_packed(get, f"{prefix}.qweight").t().contiguous(), scheme.bits, dim=1)
    qzeros = _packed(get, f"{prefix}.qzeros")
    if quant.gptq_v1_zeros:
        qzeros = _add_one_per_field(qzeros, scheme.bits)
    zero = unpack(qzeros, scheme.bits, dim=1).t().to(torch.int32)
    scale = get(f"{prefix}.scales").t()
    zero = zero[: codes.shape[0]].contiguous()
    return _in_order(codes, scale, zero, scheme, _optional(f"{prefix}.g_idx", get, has))


def _awq(quant: CheckpointQuant, prefix: str, get: Get) -> GroupQuantized:
    scheme = quant.scheme(prefix)
    bits = scheme.bits

    qweight = _packed(get, f"{prefix}.qweight").t().contiguous()  # [N / 8, K]
    codes = unpack(qweight, bits, dim=0, order=AWQ_ORDER)
    qzeros = _packed(get, f"{prefix}.qzeros")
    zero = unpack(qzeros, bits, dim=1, order=AWQ_ORDER).t().to(torch.int32)
    scale = get(f"{prefix}.scales").t()
    group = _group_size(scheme, codes.shape[1])
    return GroupQuantized(codes.contiguous(), scale.contiguous(), zero.contiguous(), bits, group)


def _ct_packed(
    quant: CheckpointQuant, prefix: str, get: Get, has: Has
) -> GroupQuantized | torch.Tensor:
    scheme = quant.scheme(prefix)
    n, k = (int(v) for v in get(f"{prefix}.weight_shape").reshape(-1).tolist())
    packed = _packed(get, f"{prefix}.weight_packed")
    if packed.shape != (n, -(-k * scheme.bits // 32)):
        raise ValueError(
            f"{prefix}: weight_shape [{n}, {k}] of {scheme.bits}-bit codes, weight_packed of "
            f"shape {tuple(packed.shape)}"
        )
    codes = unpack(packed, scheme.bits, dim=1)[:, :k]
    scale = _row_scales(get(f"{prefix}.weight_scale"), n)
    offset = 1 << (scheme.bits - 1)
    zero = torch.full(scale.shape, offset)
    if has(f"{prefix}.weight_zero_point"):
        stored = get(f"{prefix}.weight_zero_point")
        if stored.dtype == torch.int32:  # packed down the output dimension, offset
            zero = unpack(stored, scheme.bits, dim=0)[:n]
        else:  # as computed, signed (older libraries; a tensor's one zero point)
            zero = zero + _row_scales(stored, n).to(torch.int32)
    g_idx = _optional(f"{prefix}.weight_g_idx", get, has)
    return _in_order(codes, scale, zero.to(torch.int32).contiguous(), scheme, g_idx)


def _ct_int(
    quant: CheckpointQuant, prefix: str, weight: torch.Tensor, get: Get, has: Has
) -> GroupQuantized | torch.Tensor:
    if weight.dtype != torch.int8:
        raise ValueError(f"{prefix}.weight: a quantized weight of {weight.dtype}")
    scheme = quant.scheme(prefix)
    n = weight.shape[0]
    offset = 1 << (scheme.bits - 1)
    codes = (weight.to(torch.int16) + offset).to(torch.uint8)
    scale = _row_scales(get(f"{prefix}.weight_scale"), n)
    zero = torch.full(scale.shape, offset, dtype=torch.int32)
    if has(f"{prefix}.weight_zero_point"):
        zero = zero + _row_scales(get(f"{prefix}.weight_zero_point"), n).to(torch.int32)
    g_idx = _optional(f"{prefix}.weight_g_idx", get, has)
    return _in_order(codes, scale, zero, scheme, g_idx)


def _row_scales(scale: torch.Tensor, rows: int) -> torch.Tensor:
    """A scale per tensor, per row or per (row, group), as [rows, G]."""
    if scale.dim() < 2:
        return scale.reshape(1, -1).expand(rows, -1).contiguous()
    return scale


def _fp8(
    scheme: WeightScheme, prefix: str, weight: torch.Tensor, get: Get, has: Has
) -> torch.Tensor:
    """float32 weight * its scale: per tensor, per row or per [bn, bk] block."""
    w = weight.to(torch.float32)
    name = f"{prefix}.weight_scale_inv"
    scale = get(name if has(name) else f"{prefix}.weight_scale")
    if scale.dtype == torch.uint8:  # ue8m0 exponents stored as raw bytes
        scale = scale.view(torch.float8_e8m0fnu)
    scale = scale.to(torch.float32)
    n, k = w.shape
    if scale.numel() == 1:
        return w * scale.reshape(())
    if scheme.block is None:
        if scale.numel() != n:
            raise ValueError(f"{prefix}: {scale.numel()} scales for {n} rows and no block size")
        return w * scale.reshape(n, 1)
    bn, bk = scheme.block
    if tuple(scale.shape) != (-(-n // bn), -(-k // bk)):
        raise ValueError(
            f"{prefix}: scales of shape {tuple(scale.shape)} for {n} x {k} in {bn} x {bk} blocks"
        )
    rows = torch.arange(n) // bn
    columns = torch.arange(k) // bk
    return w * scale[rows][:, columns]
