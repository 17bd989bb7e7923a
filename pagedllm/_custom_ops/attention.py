"""The KV-cache write and paged attention, decode and prefill. The `*_kernel` functions run
the kernels alone, for the CPU attention backend, which the selector chose where they
apply."""

import torch

from pagedllm import _cpu_kernels, _torch_ops
from pagedllm._custom_ops.common import (
    _FLOAT32_OR_BF16,
    _as_dense,
    _as_float32,
    cpu_kernels_apply,
)
from pagedllm.tensor_layout import with_dense_rows


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Stores key/value [T, KV, D] (rows may be strided) in the caches [num_blocks,
    block_size, KV, D] at slot_mapping [T] (slot = block_id * block_size + offset), converted
    to the caches' dtype. The kernel also skips slots of -1 (padding rows of a captured decode
    step, executor/cpu_graph.py); the torch path takes real slots only."""
    if not cpu_kernels_apply(key, value, k_cache, v_cache, dtypes=_FLOAT32_OR_BF16):
        _torch_ops.reshape_and_cache(key, value, k_cache, v_cache, slot_mapping)
        return
    reshape_and_cache_kernel(key, value, k_cache, v_cache, slot_mapping)


def reshape_and_cache_kernel(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """reshape_and_cache on pagedllm._C alone, for a caller that chose the kernel (the CPU
    attention backend); _cpu_kernels raises ValueError on tensors it cannot take."""
    _cpu_kernels.reshape_and_cache(
        with_dense_rows(key),
        with_dense_rows(value),
        k_cache,
        v_cache,
        _as_dense(slot_mapping, torch.int64),
    )


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
    block_tables [B, max_blocks] and seq_lens [B] -> [B, H, D]. The kernel reads the cache in
    place; max_seq_len (the host-side max of seq_lens) sizes the torch path's padded gather.
    The caches may hold another dtype than the query (kv_cache_dtype); the output has the
    query's. The kernel computes in float32. sliding_window > 0: a query sees only its
    sequence's last that many keys (the kernel reads no others); logits_soft_cap > 0: each
    score s becomes cap * tanh(s / cap) before the softmax (0: either off)."""
    window = (sliding_window, logits_soft_cap)
    if not cpu_kernels_apply(query, k_cache, v_cache, dtypes=_FLOAT32_OR_BF16):
        return _torch_ops.paged_decode_attention(
            query, k_cache, v_cache, block_tables, seq_lens, max_seq_len, scale, *window
        )
    return paged_decode_attention_kernel(
        query, k_cache, v_cache, block_tables, seq_lens, max_seq_len, scale, *window
    )


def paged_decode_attention_kernel(
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
    """paged_decode_attention on pagedllm._C alone (see reshape_and_cache_kernel)."""
    out = _cpu_kernels.paged_decode_attention(
        _as_float32(query.contiguous()),
        k_cache,
        v_cache,
        _as_dense(block_tables, torch.int32),
        _as_dense(seq_lens, torch.int32),
        scale,
        sliding_window,
        logits_soft_cap,
    )
    return out if query.dtype is torch.float32 else _cpu_kernels.convert(out, query.dtype)


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
    """query [n, H, D] at positions seq_len - n .. seq_len - 1 of one sequence, whose keys
    and values are in the caches through block_table -> [n, H, D], causal; sliding_window
    and logits_soft_cap as paged_decode_attention's.

    On CPU float32 or bf16 tensors (any head size, a float32 or bf16 cache): pagedllm._C's
    float32 kernel (csrc/prefill_attention_f32.c), bf16 queries widened and the output
    rounded back as paged_decode_attention does. Row i is the bits paged_decode_attention
    gives its query as a sequence of seq_len - n + i + 1 tokens, so a token's output does
    not depend on whether it is decoded, recomputed alone after a prefix-cache hit, or
    prefilled in a chunk of any size. Recipes that cannot give decode's bits are not much
    faster: this kernel takes 0.7-1.3x the time of outer products summing each score in one
    FMA chain over D, and a bf16 chunk 1.4-1.6x that of AVX-512 BF16 dot products on weights
    rounded to bf16. BENCHMARKS.md has the figures; `pagedllm bench latency --input-len 512`
    times prefill (time to first token).
    Elsewhere the torch definition (sdpa).
    """
    window = (sliding_window, logits_soft_cap)
    if not cpu_kernels_apply(query, k_cache, v_cache, dtypes=_FLOAT32_OR_BF16):
        return _torch_ops.prefill_attention(
            query, k_cache, v_cache, block_table, seq_len, scale, *window
        )
    return prefill_attention_kernel(query, k_cache, v_cache, block_table, seq_len, scale, *window)


def prefill_attention_kernel(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_len: int,
    scale: float,
    sliding_window: int = 0,
    logits_soft_cap: float = 0.0,
) -> torch.Tensor:
    """prefill_attention on pagedllm._C alone (see reshape_and_cache_kernel)."""
    out = _cpu_kernels.prefill_attention_f32(
        _as_float32(query.contiguous()),
        k_cache,
        v_cache,
        _as_dense(block_table, torch.int32),
        seq_len,
        scale,
        sliding_window,
        logits_soft_cap,
    )
    return out if query.dtype is torch.float32 else _cpu_kernels.convert(out, query.dtype)
