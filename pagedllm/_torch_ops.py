"""The torch definitions of pagedllm's fast ops, on any device and dtype.

Each function here has a kernel in pagedllm._C with the same signature; `_custom_ops` runs
the kernel where it applies and this code everywhere else (GPUs, other dtypes, no
extension). The torch attention backend uses these alone, so they are also the reference
the kernels are tested against. Nothing here imports pagedllm._C.

In batch-invariant mode (pagedllm.batch_invariant) the ops that sum across a row (linear,
RMSNorm, LayerNorm, attention) run one row at a time, so each row's call, and so its bits, is
the same whatever the batch around it.
"""

from collections.abc import Callable

import torch
import torch.nn.functional as F

from pagedllm.batch_invariant import is_batch_invariant


def _per_row(fn: Callable[..., torch.Tensor], x: torch.Tensor, *args: object) -> torch.Tensor:
    """fn(row, *args) for each row of x [..., K] alone, as [..., N]: in batch-invariant mode,
    a call shaped [1, K] whatever the batch; else fn(x, *args)."""
    if not is_batch_invariant() or x.numel() <= x.shape[-1]:
        return fn(x, *args)
    rows = x.reshape(-1, x.shape[-1])
    out = torch.cat([fn(row, *args) for row in rows.split(1)])
    return out.view(*x.shape[:-1], out.shape[-1])


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., n] * rsqrt(mean(x^2) + eps) * weight [n], computed in float32 and rounded to
    x's dtype before the weight, as transformers' LlamaRMSNorm does."""
    return _per_row(_rms_norm, x, weight, eps)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual): the normed input and the new residual stream."""
    residual = x + residual
    return rms_norm(residual, weight, eps), residual


def layer_norm(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float
) -> torch.Tensor:
    """F.layer_norm of x [..., n] over its last dim, with weight [n] and bias [n] (torch's
    nn.LayerNorm: StarCoder 2's norms)."""
    return _per_row(_layer_norm, x, weight, bias, eps)


def _layer_norm(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float
) -> torch.Tensor:
    return F.layer_norm(x, x.shape[-1:], weight, bias, eps)


def fused_add_layer_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(layer_norm(x + residual), x + residual): the normed input and the new residual stream."""
    residual = x + residual
    return layer_norm(residual, weight, bias, eps), residual


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias) on a weight [N, K] or in skinny_pack's order."""
    return _per_row(F.linear, x, unpack_skinny(weight), bias)


def unpack_skinny(weight: torch.Tensor) -> torch.Tensor:
    """weight [N, K] from skinny_pack's order: float32 panels [N / 16, K, 16] or bfloat16
    tiles [N / 4, K / 32, 4, 32] (per block of weight rows, each step's values side by side);
    a weight [N, K] as it is."""
    if weight.dim() == 3:
        blocks, k, rows = weight.shape
        return weight.transpose(1, 2).reshape(blocks * rows, k)
    if weight.dim() == 4:
        blocks_n, blocks_k, rows, cols = weight.shape
        return weight.transpose(1, 2).reshape(blocks_n * rows, blocks_k * cols)
    return weight


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [..., 2d] -> silu(x[..., :d]) * x[..., d:]."""
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


def gelu_and_mul(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """x [..., 2d] -> gelu(x[..., :d]) * x[..., d:]; approximate "tanh" is torch's
    tanh form (Gemma's gelu_pytorch_tanh), "none" the erf form."""
    d = x.shape[-1] // 2
    return F.gelu(x[..., :d], approximate=approximate) * x[..., d:]


def gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """F.gelu(x); approximate "tanh" is torch's tanh form (gelu_pytorch_tanh), "none" the
    erf form."""
    return F.gelu(x, approximate=approximate)


def scale(x: torch.Tensor, alpha: float) -> torch.Tensor:
    return x * alpha


def add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a + b


def lora_masked_add(
    y: torch.Tensor, delta: torch.Tensor, row_slots: torch.Tensor, slot: int
) -> torch.Tensor:
    """y + delta on the rows whose row_slots entry is `slot`, y's rows as they are elsewhere."""
    return torch.where((row_slots == slot).unsqueeze(1), y + delta, y)


def rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox_style: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """query [T, H * head_size] and key [T, KV * head_size] with the first rotary_dim lanes
    of every head rotated by cos_sin_cache [max_pos, rotary_dim] at positions [T]; computed in
    float32, returned in the inputs' dtype."""
    cos_sin = cos_sin_cache.index_select(0, positions)  # [T, rotary_dim]
    cos, sin = cos_sin.unsqueeze(1).chunk(2, dim=-1)  # [T, 1, rotary_dim / 2]
    return (
        _rotate_heads(query, cos, sin, head_size, is_neox_style),
        _rotate_heads(key, cos, sin, head_size, is_neox_style),
    )


def _rotate_heads(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_size: int, is_neox_style: bool
) -> torch.Tensor:
    """x [T, heads * head_size]; lanes past rotary_dim = 2 * cos.shape[-1] pass through."""
    rotary_dim = 2 * cos.shape[-1]
    heads = x.reshape(x.shape[0], -1, head_size)  # [T, H, D]
    rot = heads[..., :rotary_dim].float()
    rotated = apply_rotary_emb(rot, cos, sin, is_neox_style).to(x.dtype)
    if rotary_dim < head_size:
        rotated = torch.cat((rotated, heads[..., rotary_dim:]), dim=-1)
    return rotated.reshape(x.shape)


def apply_rotary_emb(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, is_neox_style: bool
) -> torch.Tensor:
    """x [T, H, rotary_dim] rotated by angles with cos, sin [T, 1, rotary_dim / 2]. NeoX style
    pairs lane i with i + rotary_dim / 2 (rotate_half); GPT-J style pairs 2i with 2i + 1."""
    if is_neox_style:
        x1, x2 = x.chunk(2, dim=-1)
    else:
        x1, x2 = x[..., ::2], x[..., 1::2]
    o1 = x1 * cos - x2 * sin
    o2 = x2 * cos + x1 * sin
    if is_neox_style:
        return torch.cat((o1, o2), dim=-1)
    return torch.stack((o1, o2), dim=-1).flatten(-2)


def topk_softmax(
    router_logits: torch.Tensor, top_k: int, renormalize: bool, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """A MoE layer's routing: softmax over the experts in float32, the top_k largest
    (weights [T, top_k] in `dtype`, ids [T, top_k] int64), divided by their sum if
    `renormalize`."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    topk_weights, topk_ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True)
    return topk_weights.to(dtype), topk_ids


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Stores key/value [T, KV, D] in the caches [num_blocks, block_size, KV, D] at
    slot_mapping [T] (slot = block_id * block_size + offset), in the caches' dtype. A float8
    cache takes the converted bytes (torch has no float8 index_copy_ on CPU)."""
    for cache, new in ((k_cache, key), (v_cache, value)):
        rows, new = cache.view(-1, *cache.shape[2:]), new.to(cache.dtype)
        if cache.element_size() == 1:
            rows, new = rows.view(torch.uint8), new.view(torch.uint8)
        rows.index_copy_(0, slot_mapping, new)


def gather_blocks(
    cache: torch.Tensor, block_tables: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """cache [num_blocks, block_size, KV, D], block_tables [B, N] -> [B, N * block_size, KV, D]
    of `dtype`: each sequence's tokens in order, copied out of its blocks (and converted when
    the cache holds a kv_cache_dtype of its own)."""
    num_seqs, num_blocks = block_tables.shape
    gathered = cache.index_select(0, block_tables.flatten()).to(dtype)
    return gathered.view(num_seqs, num_blocks * cache.shape[1], *cache.shape[2:])


def paged_decode_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    scale: float,
    sliding_window: int = 0,
    logits_soft_cap: float = 0.0,
) -> torch.Tensor:
    """query [B, H, D], one new token per sequence; caches [num_blocks, block_size, KV, D];
    block_tables [B, max_blocks]; seq_lens [B], whose largest is max_seq_len (a host int, so
    nothing waits on the device) -> [B, H, D].

    Keys are gathered into a copy padded to max_seq_len (in the query's dtype) and masked past
    each sequence's length. GQA never copies keys per query head: the G = H / KV query heads
    of a kv head become G query rows against it. In batch-invariant mode each sequence is
    attended alone, over its own keys (attend_row). `sliding_window` > 0 lets a query see
    only its last that many tokens, itself included; `logits_soft_cap` > 0 caps each score s
    as cap * tanh(s / cap) before the softmax (Gemma 2's), see masked_attention.
    """
    if is_batch_invariant():
        return _decode_per_row(
            query, k_cache, v_cache, block_tables, seq_lens, scale, sliding_window, logits_soft_cap
        )
    num_seqs, num_heads, head_size = query.shape
    block_size, num_kv_heads = k_cache.shape[1:3]
    num_blocks = -(-max_seq_len // block_size)
    tables = block_tables[:, :num_blocks]
    key = gather_blocks(k_cache, tables, query.dtype).transpose(1, 2)
    value = gather_blocks(v_cache, tables, query.dtype).transpose(1, 2)
    positions = torch.arange(key.shape[2], device=query.device)
    mask = positions < seq_lens[:, None]
    if sliding_window > 0:
        mask &= positions >= seq_lens[:, None] - sliding_window
    mask = mask[:, None, None, :]  # [B, 1, 1, L]
    grouped = query.view(num_seqs, num_kv_heads, num_heads // num_kv_heads, head_size)
    if logits_soft_cap > 0:
        output = masked_attention(grouped, key, value, mask, scale, logits_soft_cap)
    else:
        output = F.scaled_dot_product_attention(grouped, key, value, attn_mask=mask, scale=scale)
    return output.reshape(num_seqs, num_heads, head_size)


def masked_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
    logits_soft_cap: float = 0.0,
) -> torch.Tensor:
    """softmax(cap(query @ key^T * scale) where mask, else -inf) @ value, in float32 (or the
    query's wider dtype), as the query's dtype: query [..., KV, G, n, D] or [..., KV, n, D]
    with key, value [..., KV, L, D] broadcast over G; mask broadcasts to the scores
    [..., n, L]. cap(s) = c * tanh(s / c)
    where logits_soft_cap c > 0, else s (what SDPA cannot do)."""
    dtype = torch.promote_types(query.dtype, torch.float32)
    scores = torch.matmul(query.to(dtype), key.to(dtype).transpose(-1, -2)) * scale
    if logits_soft_cap > 0:
        scores = torch.tanh(scores / logits_soft_cap) * logits_soft_cap
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), value.to(dtype)).to(query.dtype)


def prefill_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_len: int,
    scale: float,
    sliding_window: int = 0,
    logits_soft_cap: float = 0.0,
) -> torch.Tensor:
    """query [n, H, D] at positions seq_len - n .. seq_len - 1 -> [n, H, D].

    With cached context the causal mask is aligned bottom-right: query j sees keys
    0 .. seq_len - n + j, and only the last `sliding_window` of them where it is > 0
    (`logits_soft_cap`: see paged_decode_attention). In batch-invariant mode each query is
    attended alone over those keys (attend_row), as its decode would be.
    """
    if is_batch_invariant():
        return _prefill_per_row(
            query, k_cache, v_cache, block_table, seq_len, scale, sliding_window, logits_soft_cap
        )
    num_queries = query.shape[0]
    key = _sequence_kv(k_cache, block_table, seq_len, query.dtype)
    value = _sequence_kv(v_cache, block_table, seq_len, query.dtype)
    context_len = seq_len - num_queries
    if sliding_window > 0 or logits_soft_cap > 0:
        mask = _visible_keys(num_queries, seq_len, sliding_window, query.device)
        num_kv_heads = key.shape[1]
        grouped = query.view(num_queries, num_kv_heads, -1, query.shape[-1]).permute(1, 2, 0, 3)
        output = masked_attention(
            grouped,
            key.transpose(0, 1)[:, None],
            value.transpose(0, 1)[:, None],
            mask,
            scale,
            logits_soft_cap,
        )
        return output.permute(2, 0, 1, 3).reshape(query.shape)
    mask = None
    if context_len > 0:
        mask = torch.ones(num_queries, seq_len, dtype=torch.bool, device=query.device)
        mask = mask.tril(context_len)
    # [1, heads, tokens, D]; enable_gqa lets query head h read kv head h // group in place
    # (5-10% faster per call on CPU in bf16 than expanding the kv heads, float32 the same).
    output = F.scaled_dot_product_attention(
        query.transpose(0, 1)[None],
        key.transpose(0, 1)[None],
        value.transpose(0, 1)[None],
        attn_mask=mask,
        is_causal=context_len == 0,
        scale=scale,
        enable_gqa=True,
    )
    return output[0].transpose(0, 1)


def _visible_keys(
    num_queries: int, seq_len: int, sliding_window: int, device: torch.device
) -> torch.Tensor:
    """[n, seq_len] bool: the keys each of the last n positions of a sequence of seq_len
    tokens attends, causal and within `sliding_window` where it is > 0."""
    query_pos = torch.arange(seq_len - num_queries, seq_len, device=device)[:, None]
    key_pos = torch.arange(seq_len, device=device)
    mask = key_pos <= query_pos
    if sliding_window > 0:
        mask &= key_pos > query_pos - sliding_window
    return mask


def attend_row(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scale: float,
    logits_soft_cap: float = 0.0,
) -> torch.Tensor:
    """One query [H, D] over all of key, value [L, KV, D] -> [H, D]: the call shaped the same
    for a token decoded or prefilled, alone or batched (batch-invariant mode)."""
    num_heads, head_size = query.shape
    num_kv_heads = key.shape[1]
    grouped = query.reshape(1, num_kv_heads, num_heads // num_kv_heads, head_size)
    key, value = key.transpose(0, 1)[None], value.transpose(0, 1)[None]
    if logits_soft_cap > 0:
        every = torch.ones(1, dtype=torch.bool, device=query.device)
        output = masked_attention(grouped, key, value, every, scale, logits_soft_cap)
    else:
        output = F.scaled_dot_product_attention(grouped, key, value, scale=scale)
    return output.reshape(num_heads, head_size)


def _sequence_kv(
    cache: torch.Tensor, block_table: torch.Tensor, seq_len: int, dtype: torch.dtype
) -> torch.Tensor:
    """One sequence's first seq_len tokens [seq_len, KV, D] of `dtype`, out of its blocks."""
    table = block_table[None, : -(-seq_len // cache.shape[1])]
    return gather_blocks(cache, table, dtype)[0, :seq_len]


def _window_start(length: int, sliding_window: int) -> int:
    """The first key a query at position length - 1 sees."""
    return max(0, length - sliding_window) if sliding_window > 0 else 0


def _decode_per_row(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    sliding_window: int,
    logits_soft_cap: float,
) -> torch.Tensor:
    rows = []
    for i, seq_len in enumerate(seq_lens.tolist()):
        key = _sequence_kv(k_cache, block_tables[i], seq_len, query.dtype)
        value = _sequence_kv(v_cache, block_tables[i], seq_len, query.dtype)
        start = _window_start(seq_len, sliding_window)
        rows.append(attend_row(query[i], key[start:], value[start:], scale, logits_soft_cap))
    return torch.stack(rows)


def _prefill_per_row(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_len: int,
    scale: float,
    sliding_window: int,
    logits_soft_cap: float,
) -> torch.Tensor:
    key = _sequence_kv(k_cache, block_table, seq_len, query.dtype)
    value = _sequence_kv(v_cache, block_table, seq_len, query.dtype)
    first = seq_len - query.shape[0] + 1  # keys the first query sees
    rows = []
    for j, q in enumerate(query):
        start, end = _window_start(first + j, sliding_window), first + j
        rows.append(attend_row(q, key[start:end], value[start:end], scale, logits_soft_cap))
    return torch.stack(rows)
