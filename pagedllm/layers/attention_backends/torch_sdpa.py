"""Reference attention over the paged KV cache, in torch ops (CPU and CUDA).

A step's batch mixes prefill chunks (q_len > 1, possibly after cached context) and
decodes (q_len == 1). All decodes run as one padded SDPA call; prefill chunks run one
sequence at a time. The plan comes from the metadata's Python lengths, so nothing waits
on the device.

GQA never copies keys per query head: a decode's G = H / KV query heads become G query
rows against their kv head, and a prefill expands kv heads with stride 0.

On CPU in float32, decodes go to pagedllm._C's kernel, which reads the paged cache in
place (see pagedllm/_custom_ops.py); the torch path here is its reference.
"""

from itertools import accumulate

import torch
import torch.nn.functional as F

from pagedllm import _custom_ops
from pagedllm.forward_context import AttentionMetadata


def write_to_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store key/value [T, KV, D] in the caches [num_blocks, block_size, KV, D] at
    slot_mapping [T] (slot = block_id * block_size + offset)."""
    if _custom_ops.cpu_kernels_apply(key, value, k_cache, v_cache):
        _custom_ops.reshape_and_cache(key, value, k_cache, v_cache, slot_mapping)
        return
    num_kv_heads, head_size = k_cache.shape[2:]
    k_cache.view(-1, num_kv_heads, head_size).index_copy_(0, slot_mapping, key)
    v_cache.view(-1, num_kv_heads, head_size).index_copy_(0, slot_mapping, value)


def paged_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    attn_metadata: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """query [T, H, D] -> [T, H, D]: each sequence's new queries attend causally over all
    seq_len tokens of its cache, the last q_len of which are the new ones."""
    query_lens = attn_metadata.query_lens_cpu
    if all(n == 1 for n in query_lens):
        return _decode_attention(
            query,
            k_cache,
            v_cache,
            attn_metadata.block_tables,
            attn_metadata.seq_lens,
            attn_metadata.max_seq_len,
            scale,
        )
    output = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    starts = list(accumulate(query_lens, initial=0))
    decodes = [i for i, n in enumerate(query_lens) if n == 1]
    if decodes:
        seq_idx = torch.tensor(decodes, device=query.device)
        rows = torch.tensor([starts[i] for i in decodes], device=query.device)
        decoded = _decode_attention(
            query.index_select(0, rows),
            k_cache,
            v_cache,
            attn_metadata.block_tables.index_select(0, seq_idx),
            attn_metadata.seq_lens.index_select(0, seq_idx),
            max(attn_metadata.seq_lens_cpu[i] for i in decodes),
            scale,
        )
        output.index_copy_(0, rows, decoded)
    for i, n in enumerate(query_lens):
        if n > 1:
            output[starts[i] : starts[i + 1]] = _prefill_attention(
                query[starts[i] : starts[i + 1]],
                k_cache,
                v_cache,
                attn_metadata.block_tables[i],
                attn_metadata.seq_lens_cpu[i],
                scale,
            )
    return output


def _gather_blocks(cache: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
    """cache [num_blocks, block_size, KV, D], block_tables [B, N] -> [B, N * block_size, KV, D]."""
    num_seqs, num_blocks = block_tables.shape
    gathered = cache.index_select(0, block_tables.flatten())
    return gathered.view(num_seqs, num_blocks * cache.shape[1], *cache.shape[2:])


def _decode_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    scale: float,
) -> torch.Tensor:
    """query [B, H, D], one new token per sequence, block_tables [B, max_blocks],
    seq_lens [B] -> [B, H, D].

    Keys are padded to max_seq_len and masked past each sequence's length.
    """
    if _custom_ops.cpu_kernels_apply(query, k_cache, v_cache):
        return _custom_ops.paged_decode_attention(
            query, k_cache, v_cache, block_tables, seq_lens, scale
        )
    num_seqs, num_heads, head_size = query.shape
    block_size, num_kv_heads = k_cache.shape[1:3]
    num_blocks = -(-max_seq_len // block_size)
    key = _gather_blocks(k_cache, block_tables[:, :num_blocks]).transpose(1, 2)
    value = _gather_blocks(v_cache, block_tables[:, :num_blocks]).transpose(1, 2)
    positions = torch.arange(key.shape[2], device=query.device)
    mask = (positions < seq_lens[:, None])[:, None, None, :]  # [B, 1, 1, L]
    grouped = query.view(num_seqs, num_kv_heads, num_heads // num_kv_heads, head_size)
    output = F.scaled_dot_product_attention(grouped, key, value, attn_mask=mask, scale=scale)
    return output.reshape(num_seqs, num_heads, head_size)


def _prefill_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_len: int,
    scale: float,
) -> torch.Tensor:
    """query [n, H, D] at positions seq_len - n .. seq_len - 1 -> [n, H, D].

    With cached context the causal mask is aligned bottom-right: query j sees keys
    0 .. seq_len - n + j.
    """
    num_queries, num_heads, head_size = query.shape
    block_size, num_kv_heads = k_cache.shape[1:3]
    group = num_heads // num_kv_heads
    num_blocks = -(-seq_len // block_size)
    shape = (num_kv_heads, group, seq_len, head_size)
    key = _gather_blocks(k_cache, block_table[None, :num_blocks])[0, :seq_len]
    value = _gather_blocks(v_cache, block_table[None, :num_blocks])[0, :seq_len]
    key = key.transpose(0, 1)[:, None].expand(shape)  # [KV, G, L, D]
    value = value.transpose(0, 1)[:, None].expand(shape)
    grouped = query.view(num_queries, num_kv_heads, group, head_size).permute(1, 2, 0, 3)
    context_len = seq_len - num_queries
    mask = None
    if context_len > 0:
        mask = torch.ones(num_queries, seq_len, dtype=torch.bool, device=query.device)
        mask = mask.tril(context_len)
    output = F.scaled_dot_product_attention(
        grouped, key, value, attn_mask=mask, is_causal=context_len == 0, scale=scale
    )
    return output.permute(2, 0, 1, 3).reshape(num_queries, num_heads, head_size)
