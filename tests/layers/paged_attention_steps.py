"""Random paged sequences stepped through an Attention layer, checked against dense causal
attention softmax(Q K^T * scale + causal mask) V over each whole sequence, kv heads expanded.
Shared by the tests of the layer and of each attention backend; on the CPU unless a test
names its device (the Triton backend's: a GPU, or the CPU under the interpreter)."""

import torch

from pagedllm.forward_context import AttentionMetadata, set_forward_context
from pagedllm.layers.attention import Attention

HEAD_SIZE = 8
SCALE = 0.3
NUM_BLOCKS = 40
HEAD_CONFIGS = [(8, 2), (4, 4), (4, 1)]  # (num_heads, num_kv_heads): GQA, MHA, MQA


class PagedSeq:
    """A sequence's random q, k, v for its whole life and its shuffled physical blocks."""

    def __init__(self, length: int, block_ids: list[int], attn: Attention, gen: torch.Generator):
        device = attn.kv_cache[0].device
        self.q = torch.randn(length, attn.num_heads * HEAD_SIZE, generator=gen).to(device)
        self.k = torch.randn(length, attn.num_kv_heads * HEAD_SIZE, generator=gen).to(device)
        self.v = torch.randn(length, attn.num_kv_heads * HEAD_SIZE, generator=gen).to(device)
        self.block_ids = block_ids
        self.num_computed = 0


def make_seqs(lengths: list[int], attn: Attention, block_size: int, seed: int) -> list[PagedSeq]:
    """Blocks come from one random permutation, so tables are scattered and unordered."""
    gen = torch.Generator().manual_seed(seed)
    free = torch.randperm(NUM_BLOCKS, generator=gen).tolist()
    seqs = []
    for length in lengths:
        num_blocks = -(-length // block_size)
        seqs.append(PagedSeq(length, free[:num_blocks], attn, gen))
        free = free[num_blocks:]
    return seqs


def make_attention(
    num_heads: int, num_kv_heads: int, block_size: int, device: torch.device | str = "cpu"
) -> Attention:
    """The layer built for `device` (its backend chosen for it), its caches there."""
    with torch.device(device):
        attn = Attention(num_heads, HEAD_SIZE, SCALE, num_kv_heads)
    shape = (NUM_BLOCKS, block_size, num_kv_heads, HEAD_SIZE)
    gen = torch.Generator().manual_seed(123)
    attn.kv_cache = tuple(torch.randn(shape, generator=gen).to(device) for _ in range(2))
    return attn


def dense_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_heads: int, num_kv_heads: int
) -> torch.Tensor:
    """q [n, H*D] for the last n of the L positions of k, v [L, KV*D] -> [n, H*D]."""
    n, seq_len = q.shape[0], k.shape[0]
    group = num_heads // num_kv_heads
    q = q.view(n, num_heads, HEAD_SIZE)
    k = k.view(seq_len, num_kv_heads, HEAD_SIZE).repeat_interleave(group, dim=1)
    v = v.view(seq_len, num_kv_heads, HEAD_SIZE).repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * SCALE
    query_pos = torch.arange(seq_len - n, seq_len, device=q.device)[:, None]
    scores = scores.masked_fill(torch.arange(seq_len, device=q.device) > query_pos, float("-inf"))
    out = torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), v)
    return out.reshape(n, num_heads * HEAD_SIZE)


def build_metadata(seqs: list[PagedSeq], num_new: list[int], block_size: int) -> AttentionMetadata:
    """The step's metadata on the sequences' device."""
    device = seqs[0].q.device
    slots, seq_lens = [], []
    for seq, n in zip(seqs, num_new, strict=True):
        for pos in range(seq.num_computed, seq.num_computed + n):
            slots.append(seq.block_ids[pos // block_size] * block_size + pos % block_size)
        seq_lens.append(seq.num_computed + n)
    max_blocks = max(len(seq.block_ids) for seq in seqs) + 1
    block_tables = torch.zeros(len(seqs), max_blocks, dtype=torch.int32)
    for i, seq in enumerate(seqs):
        block_tables[i, : len(seq.block_ids)] = torch.tensor(seq.block_ids)
    query_start_loc = torch.tensor([0, *num_new], dtype=torch.int32).cumsum(0).to(torch.int32)
    return AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        query_start_loc=query_start_loc.to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_tables=block_tables.to(device),
        query_lens_cpu=list(num_new),
        seq_lens_cpu=seq_lens,
    )


def step_and_check(
    attn: Attention, seqs: list[PagedSeq], num_new: list[int], block_size: int
) -> None:
    """Run one step of num_new[i] tokens for each sequence; check the cache and the output."""
    new = [
        torch.cat([s.q, s.k, s.v], dim=1)[s.num_computed : s.num_computed + n]
        for s, n in zip(seqs, num_new, strict=True)
    ]
    qkv = torch.cat(new)  # q, k, v are column slices of it, as the model passes them
    q_size, kv_size = attn.num_heads * HEAD_SIZE, attn.num_kv_heads * HEAD_SIZE
    q, k, v = qkv.split([q_size, kv_size, kv_size], dim=1)
    metadata = build_metadata(seqs, num_new, block_size)
    before = [c.clone() for c in attn.kv_cache]
    with set_forward_context(metadata):
        out = attn(q, k, v)

    slots = metadata.slot_mapping
    for cache, old, new_kv in zip(attn.kv_cache, before, (k, v), strict=True):
        flat, old_flat = cache.view(-1, kv_size), old.view(-1, kv_size)
        assert torch.equal(flat[slots], new_kv)
        untouched = torch.ones(flat.shape[0], dtype=torch.bool, device=flat.device)
        untouched[slots] = False
        assert torch.equal(flat[untouched], old_flat[untouched])

    start = 0
    for seq, n in zip(seqs, num_new, strict=True):
        end = seq.num_computed + n
        expected = dense_reference(
            seq.q[seq.num_computed : end],
            seq.k[:end],
            seq.v[:end],
            attn.num_heads,
            attn.num_kv_heads,
        )
        assert (out[start : start + n] - expected).abs().max() <= 1e-5
        seq.num_computed, start = end, start + n
