"""Random paged batches for the Triton kernels' tests: caches filled at random, sequences
scattered over shuffled blocks, and the torch reference's answer for them."""

from collections.abc import Callable
from dataclasses import dataclass

import torch

from pagedllm import _torch_ops


@dataclass
class PagedBatch:
    query: torch.Tensor  # [T, H, D]
    k_cache: torch.Tensor  # [num_blocks, block_size, KV, D]
    v_cache: torch.Tensor
    query_start_loc: torch.Tensor  # [B + 1] int32
    seq_lens: torch.Tensor  # [B] int32
    block_tables: torch.Tensor  # [B, max_blocks] int32
    query_lens: list[int]
    seq_lens_list: list[int]
    scale: float

    @property
    def max_query_len(self) -> int:
        return max(self.query_lens)

    @property
    def max_seq_len(self) -> int:
        return max(self.seq_lens_list)


def make_batch(
    query_lens: list[int],
    seq_lens: list[int],
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device,
    seed: int = 0,
    cache_dtype: torch.dtype | None = None,
) -> PagedBatch:
    """Sequence i has seq_lens[i] tokens in the cache, its last query_lens[i] new; its blocks
    are a random share of a shuffled pool (one spare block stays unused). The caches hold
    cache_dtype (default: dtype). Built on the CPU, moved to `device`."""
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + 1
    pool = torch.randperm(num_blocks, generator=gen).to(torch.int32)
    tables = torch.zeros(len(seq_lens), max(blocks_per_seq) + 1, dtype=torch.int32)
    used = 0
    for i, n in enumerate(blocks_per_seq):
        tables[i, :n] = pool[used : used + n]
        used += n
    shape = (num_blocks, block_size, num_kv_heads, head_size)
    cache_dtype = cache_dtype or dtype
    k_cache, v_cache = (torch.randn(shape, generator=gen).to(cache_dtype) for _ in range(2))
    query = torch.randn(sum(query_lens), num_heads, head_size, generator=gen).to(dtype)
    starts = [0]
    for n in query_lens:
        starts.append(starts[-1] + n)
    return PagedBatch(
        query=query.to(device),
        k_cache=k_cache.to(device),
        v_cache=v_cache.to(device),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_tables=tables.to(device),
        query_lens=list(query_lens),
        seq_lens_list=list(seq_lens),
        scale=head_size**-0.5,
    )


def reference(
    batch: PagedBatch, sliding_window: int = 0, logits_soft_cap: float = 0.0
) -> torch.Tensor:
    """The torch reference in float32 on the CPU: _torch_ops.prefill_attention per sequence
    (a decode is a one-token chunk), with the window and the soft cap passed on."""
    return _per_sequence(batch, _torch_ops.prefill_attention, sliding_window, logits_soft_cap)


def dense_reference(
    batch: PagedBatch, sliding_window: int = 0, logits_soft_cap: float = 0.0
) -> torch.Tensor:
    """The formula written out, independent of _torch_ops' attention: each sequence's keys
    gathered, scores s = q.k * scale capped to c * tanh(s / c) where c > 0, masked to keys
    0 .. p (and p - W + 1 .. p for a window W > 0) for a query at position p, softmax."""
    return _per_sequence(batch, _dense, sliding_window, logits_soft_cap)


def _per_sequence(batch: PagedBatch, attend: Callable, *options: float) -> torch.Tensor:
    out = torch.empty(batch.query.shape, dtype=torch.float32)
    k_cache, v_cache = batch.k_cache.cpu().float(), batch.v_cache.cpu().float()
    starts = batch.query_start_loc.tolist()
    for i, seq_len in enumerate(batch.seq_lens_list):
        query = batch.query[starts[i] : starts[i + 1]].cpu().float()
        table = batch.block_tables[i].cpu()
        out[starts[i] : starts[i + 1]] = attend(
            query, k_cache, v_cache, table, seq_len, batch.scale, *options
        )
    return out


def _dense(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    table: torch.Tensor,
    seq_len: int,
    scale: float,
    window: int,
    cap: float,
) -> torch.Tensor:
    key, value = (
        _torch_ops.gather_blocks(c, table[None], torch.float32)[0, :seq_len]
        for c in (k_cache, v_cache)
    )
    group = query.shape[1] // key.shape[1]
    key, value = (x.repeat_interleave(group, dim=1) for x in (key, value))  # [L, H, D]
    positions = torch.arange(seq_len - query.shape[0], seq_len)[:, None]  # [n, 1]
    keys = torch.arange(seq_len)[None, :]
    seen = keys <= positions  # [n, L]
    if window:
        seen &= positions - keys < window
    scores = torch.einsum("nhd,lhd->hnl", query, key) * scale
    if cap:
        scores = cap * torch.tanh(scores / cap)
    probs = scores.masked_fill(~seen, float("-inf")).softmax(-1)
    return torch.einsum("hnl,lhd->nhd", probs, value)
