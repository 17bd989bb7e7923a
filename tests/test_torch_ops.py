"""The torch definitions of the fast ops: paged attention against dense softmax attention per
sequence, the cache write and block gather against plain indexing. (The norms, activation and
rotation are held against transformers by the layer tests' torch path.) A linear on a
weight in skinny_pack's order is F.linear on the weight."""

import pytest
import torch
import torch.nn.functional as F

from pagedllm import _cpu_kernels, _torch_ops


def _paged_cache(keys: list[torch.Tensor], block_size: int, num_blocks: int):
    """Each sequence's [L, KV, D] rows written into shuffled blocks -> (cache, block tables)."""
    kv, d = keys[0].shape[1:]
    cache = torch.randn(num_blocks, block_size, kv, d, dtype=torch.float64)
    free = torch.randperm(num_blocks).tolist()
    max_blocks = max(-(-len(k) // block_size) for k in keys)
    tables = torch.zeros(len(keys), max_blocks, dtype=torch.int32)
    for i, k in enumerate(keys):
        for t in range(len(k)):
            if t % block_size == 0:
                tables[i, t // block_size] = free.pop()
            cache[tables[i, t // block_size], t % block_size] = k[t]
    return cache, tables


def test_paged_decode_attention_equals_dense_softmax_attention() -> None:
    """Reference: softmax(q k^T * scale) v over each sequence's own keys, kv head h // G."""
    heads, kv, d, block_size, scale = 6, 2, 8, 4, 0.4
    lengths = [1, 9, 4]
    keys = [torch.randn(n, kv, d, dtype=torch.float64) for n in lengths]
    values = [torch.randn(n, kv, d, dtype=torch.float64) for n in lengths]
    torch.manual_seed(3)
    k_cache, tables = _paged_cache(keys, block_size, 12)
    torch.manual_seed(3)
    v_cache, same_tables = _paged_cache(values, block_size, 12)
    assert torch.equal(tables, same_tables)
    query = torch.randn(len(lengths), heads, d, dtype=torch.float64)
    seq_lens = torch.tensor(lengths, dtype=torch.int32)
    out = _torch_ops.paged_decode_attention(query, k_cache, v_cache, tables, seq_lens, 9, scale)
    for i in range(len(lengths)):
        k = keys[i].repeat_interleave(heads // kv, dim=1)  # [L, H, D]
        v = values[i].repeat_interleave(heads // kv, dim=1)
        probs = torch.softmax(torch.einsum("hd,lhd->hl", query[i], k) * scale, dim=-1)
        torch.testing.assert_close(out[i], torch.einsum("hl,lhd->hd", probs, v))


def test_reshape_and_cache_writes_only_the_given_slots() -> None:
    """Reference: the flat [num_slots, KV, D] view indexed by slot."""
    k_cache, v_cache = torch.zeros(3, 4, 2, 5), torch.zeros(3, 4, 2, 5)
    key, value = torch.randn(2, 2, 5), torch.randn(2, 2, 5)
    _torch_ops.reshape_and_cache(key, value, k_cache, v_cache, torch.tensor([9, 2]))
    flat_k, flat_v = k_cache.view(12, 2, 5), v_cache.view(12, 2, 5)
    assert torch.equal(flat_k[[9, 2]], key) and torch.equal(flat_v[[9, 2]], value)
    assert flat_k.abs().sum() == key.abs().sum()


def test_gather_blocks_lists_each_sequence_in_token_order_in_the_dtype() -> None:
    cache = torch.arange(4 * 2).view(4, 2, 1, 1).bfloat16()  # token t of block b holds 2b + t
    tables = torch.tensor([[3, 0], [1, 2]])
    gathered = _torch_ops.gather_blocks(cache, tables, torch.float32).flatten(1)
    assert gathered.dtype == torch.float32
    assert gathered.tolist() == [[6, 7, 0, 1], [2, 3, 4, 5]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_on_a_skinny_packed_weight_is_f_linear_on_the_plain_weight(
    dtype: torch.dtype,
) -> None:
    w, b = torch.randn(32, 64).to(dtype), torch.randn(32).to(dtype)
    x = torch.randn(3, 5, 64).to(dtype)
    packed = _cpu_kernels.skinny_pack(w)
    assert torch.equal(_torch_ops.unpack_skinny(packed), w)
    assert torch.equal(_torch_ops.linear(x, packed, b), F.linear(x, w, b))
    assert torch.equal(_torch_ops.linear(x, w, b), F.linear(x, w, b))
