"""The rotary embedding of q and k in Triton: one program a token, one launch a layer.

On a GPU the torch definition (pagedllm/_torch_ops.py) is 19 kernels a layer. The
arithmetic is the torch definition's: the rotated lanes in float32, out = x * cos + sign *
x[partner] * sin with the partner lane and sign of the style (NeoX: lane i and i +
rotary_dim / 2; GPT-J: lanes 2i and 2i + 1), rounded once to the input's dtype; lanes past
rotary_dim are copied. With Qwen3's q_norm and k_norm the same program RMS-norms each head
first (3 launches and their copies of strided heads, folded into this one).
"""

import torch
import triton
import triton.language as tl

from pagedllm._triton_ops.launch import for_device


@triton.jit
def _rotate_heads(
    src_ptr,
    dst_ptr,
    stride_src,
    stride_dst,
    token,
    cos,
    sin,
    partner,
    sign,
    lanes,
    rotated,
    norm_weight_ptr,
    eps,
    HEADS: tl.constexpr,
    HEADS_PADDED: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    QK_NORM: tl.constexpr,
):
    heads = tl.arange(0, HEADS_PADDED)[:, None]
    mask = (heads < HEADS) & (lanes < HEAD_SIZE)
    src = src_ptr + token * stride_src + heads * HEAD_SIZE
    x = tl.load(src + lanes, mask=mask, other=0.0).to(tl.float32)
    pair = tl.load(src + partner, mask=mask & rotated, other=0.0).to(tl.float32)
    if QK_NORM:  # each head RMS-normed first, rounded as the norm's own output would be
        scale = tl.math.rsqrt(tl.sum(x * x, axis=1) / HEAD_SIZE + eps)[:, None]
        dtype = dst_ptr.dtype.element_ty
        weight = tl.load(norm_weight_ptr + lanes, mask=lanes < HEAD_SIZE, other=0.0)
        pair_weight = tl.load(norm_weight_ptr + partner, mask=rotated, other=0.0)
        x = (weight.to(tl.float32) * (x * scale).to(dtype).to(tl.float32)).to(dtype)
        pair = (pair_weight.to(tl.float32) * (pair * scale).to(dtype).to(tl.float32)).to(dtype)
        x, pair = x.to(tl.float32), pair.to(tl.float32)
    out = tl.where(rotated, x * cos + sign * pair * sin, x)
    dst = dst_ptr + token * stride_dst + heads * HEAD_SIZE + lanes
    tl.store(dst, out.to(dst_ptr.dtype.element_ty), mask=mask)


@triton.jit
def rotary_embedding_kernel(
    positions_ptr,
    query_ptr,
    key_ptr,
    cos_sin_ptr,
    query_out_ptr,
    key_out_ptr,
    q_weight_ptr,
    k_weight_ptr,
    stride_query,
    stride_key,
    stride_cos_sin,
    eps,
    NUM_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEADS_PADDED: tl.constexpr,
    KV_HEADS_PADDED: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    HEAD_PADDED: tl.constexpr,
    ROTARY_DIM: tl.constexpr,
    IS_NEOX: tl.constexpr,
    QK_NORM: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    position = tl.load(positions_ptr + token)
    lanes = tl.arange(0, HEAD_PADDED)[None, :]
    rotated = lanes < ROTARY_DIM
    half: tl.constexpr = ROTARY_DIM // 2
    if IS_NEOX:
        first = lanes < half
        frequency = tl.where(first, lanes, lanes - half)
        partner = tl.where(first, lanes + half, lanes - half)
    else:
        first = lanes % 2 == 0
        frequency = lanes // 2
        partner = tl.where(first, lanes + 1, lanes - 1)
    sign = tl.where(first, -1.0, 1.0)
    angles = cos_sin_ptr + position * stride_cos_sin
    cos = tl.load(angles + frequency, mask=rotated, other=1.0)
    sin = tl.load(angles + half + frequency, mask=rotated, other=0.0)
    query_stride_out: tl.constexpr = NUM_HEADS * HEAD_SIZE
    key_stride_out: tl.constexpr = NUM_KV_HEADS * HEAD_SIZE
    _rotate_heads(
        query_ptr, query_out_ptr, stride_query, query_stride_out, token, cos, sin,
        partner, sign, lanes, rotated, q_weight_ptr, eps,
        NUM_HEADS, HEADS_PADDED, HEAD_SIZE, QK_NORM,
    )  # fmt: skip
    _rotate_heads(
        key_ptr, key_out_ptr, stride_key, key_stride_out, token, cos, sin,
        partner, sign, lanes, rotated, k_weight_ptr, eps,
        NUM_KV_HEADS, KV_HEADS_PADDED, HEAD_SIZE, QK_NORM,
    )  # fmt: skip


def rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox_style: bool,
    qk_norm: tuple[torch.Tensor, torch.Tensor, float] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """query [T, H * head_size] and key [T, KV * head_size] (rows may be strided: column
    slices of a fused qkv) rotated by cos_sin_cache [max_pos, rotary_dim] (float32) at
    positions [T]; new contiguous tensors in the inputs' dtype. Positions are not checked
    against the cache (that is a host sync): the caller keeps the cache long enough.

    qk_norm (q_weight [head_size], k_weight [head_size], eps): each head of q and k is first
    RMS-normed with its weight (Qwen3's q_norm and k_norm), in the same launch."""
    tokens = query.shape[0]
    num_heads, num_kv_heads = query.shape[1] // head_size, key.shape[1] // head_size
    query_out = torch.empty((tokens, query.shape[1]), dtype=query.dtype, device=query.device)
    key_out = torch.empty((tokens, key.shape[1]), dtype=key.dtype, device=key.device)
    if tokens == 0:
        return query_out, key_out
    query, key = _unit_lanes(query), _unit_lanes(key)
    cos_sin_cache = _unit_lanes(cos_sin_cache)
    for_device(rotary_embedding_kernel, query.device)[(tokens,)](
        positions,
        query,
        key,
        cos_sin_cache,
        query_out,
        key_out,
        qk_norm[0] if qk_norm else query,
        qk_norm[1] if qk_norm else key,
        query.stride(0),
        key.stride(0),
        cos_sin_cache.stride(0),
        qk_norm[2] if qk_norm else 0.0,
        NUM_HEADS=num_heads,
        NUM_KV_HEADS=num_kv_heads,
        HEADS_PADDED=triton.next_power_of_2(num_heads),
        KV_HEADS_PADDED=triton.next_power_of_2(num_kv_heads),
        HEAD_SIZE=head_size,
        HEAD_PADDED=triton.next_power_of_2(head_size),
        ROTARY_DIM=cos_sin_cache.shape[1],
        IS_NEOX=is_neox_style,
        QK_NORM=qk_norm is not None,
        num_warps=4,
    )
    return query_out, key_out


def _unit_lanes(x: torch.Tensor) -> torch.Tensor:
    """x [rows, n] with unit stride along n (the rows may stay strided)."""
    return x if x.stride(-1) == 1 else x.contiguous()
