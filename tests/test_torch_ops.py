"""The torch definitions of the fast ops: paged attention against dense softmax attention per
sequence, the cache write and block gather against plain indexing. (The norms, activation and
rotation are held against transformers by the layer tests' torch path.) A linear on a
weight in skinny_pack's order is F.linear on the weight. In batch-invariant mode, linear,
RMSNorm and attention give each row the bits of that row computed alone."""

import pytest
import torch
import torch.nn.functional as F

from pagedllm import _cpu_kernels, _torch_ops
from pagedllm.batch_invariant import set_batch_invariant


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


@pytest.fixture
def batch_invariant():
    """Batch-invariant mode on for one test, off after it."""
    set_batch_invariant(True)
    yield
    set_batch_invariant(False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_batch_invariant_linear_and_rms_norm_give_each_row_its_bits_alone(
    batch_invariant: None, dtype: torch.dtype
) -> None:
    """Reference: the op on the row alone; every row count from 1 to 40 and 300."""
    torch.manual_seed(0)
    weight = torch.randn(96, 80, dtype=dtype)
    bias, norm = torch.randn(96, dtype=dtype), torch.randn(80, dtype=dtype)
    x = torch.randn(300, 80, dtype=dtype)
    alone = [_torch_ops.linear(x[i : i + 1], weight, bias) for i in range(300)]
    normed = [_torch_ops.rms_norm(x[i : i + 1], norm, 1e-6) for i in range(300)]
    for m in [*range(1, 41), 300]:
        assert torch.equal(_torch_ops.linear(x[:m], weight, bias), torch.cat(alone[:m]))
        assert torch.equal(_torch_ops.rms_norm(x[:m], norm, 1e-6), torch.cat(normed[:m]))
    torch.testing.assert_close(
        _torch_ops.linear(x.view(20, 15, 80), weight, bias),
        F.linear(x, weight, bias).view(20, 15, 96),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batch_invariant_attention_gives_a_prefill_row_its_decode_bits(
    batch_invariant: None, dtype: torch.dtype
) -> None:
    """Each query of a 13-token chunk after 6 cached tokens, and of the 19-token prompt
    prefilled whole, is the bits of that token decoded alone and decoded beside two other
    sequences; all close to the mode's off results."""
    heads, kv, d, block_size, scale = 6, 2, 8, 4, 0.3
    torch.manual_seed(1)
    keys = [torch.randn(n, kv, d) for n in (19, 7, 30)]
    torch.manual_seed(5)
    k_cache, tables = _paged_cache(keys, block_size, 20)
    torch.manual_seed(5)
    v_cache, _ = _paged_cache([torch.randn(n, kv, d) for n in (19, 7, 30)], block_size, 20)
    k_cache, v_cache = k_cache.to(dtype), v_cache.to(dtype)
    query = torch.randn(19, heads, d, dtype=dtype)
    chunk = _torch_ops.prefill_attention(query[6:], k_cache, v_cache, tables[0], 19, scale)
    whole = _torch_ops.prefill_attention(query, k_cache, v_cache, tables[0], 19, scale)
    for t in range(19):
        lens = torch.tensor([t + 1, 7, 30], dtype=torch.int32)
        batch = query[t : t + 1].expand(3, heads, d).contiguous()
        beside = _torch_ops.paged_decode_attention(batch, k_cache, v_cache, tables, lens, 30, scale)
        alone = _torch_ops.paged_decode_attention(
            query[t : t + 1], k_cache, v_cache, tables[:1], lens[:1], t + 1, scale
        )
        assert torch.equal(beside[0], alone[0]) and torch.equal(whole[t], alone[0])
        if t >= 6:
            assert torch.equal(chunk[t - 6], alone[0])
    set_batch_invariant(False)
    tol = dict(atol=1e-2, rtol=1e-2) if dtype is torch.bfloat16 else {}
    batched = _torch_ops.prefill_attention(query, k_cache, v_cache, tables[0], 19, scale)
    torch.testing.assert_close(whole, batched, **tol)


def _dense_row(q, keys, values, heads, start, end, scale, cap):
    """softmax(cap(q k^T * scale)) v of one query [H, D] over keys [start, end)."""
    kv = keys.shape[1]
    k = keys[start:end].repeat_interleave(heads // kv, dim=1)
    v = values[start:end].repeat_interleave(heads // kv, dim=1)
    scores = torch.einsum("hd,lhd->hl", q, k) * scale
    if cap:
        scores = cap * torch.tanh(scores / cap)
    return torch.einsum("hl,lhd->hd", torch.softmax(scores, dim=-1), v)


@pytest.mark.parametrize("batch_invariant", [False, True])
@pytest.mark.parametrize(("window", "cap"), [(3, 0.0), (0, 0.7), (5, 1.5), (40, 0.0)])
def test_windows_and_soft_caps_follow_their_definition(
    window: int, cap: float, batch_invariant: bool
) -> None:
    """Reference: dense attention of each query over its last `window` positions (itself
    included), scores s capped as cap * tanh(s / cap); decodes of sequences of 1 to 13
    tokens and a 7-token chunk after 6 cached ones."""
    heads, kv, d, block_size, scale = 4, 2, 8, 4, 0.9
    lengths = [1, 6, 13]
    keys = [torch.randn(n, kv, d, dtype=torch.float64) for n in lengths]
    values = [torch.randn(n, kv, d, dtype=torch.float64) for n in lengths]
    torch.manual_seed(5)
    k_cache, tables = _paged_cache(keys, block_size, 12)
    torch.manual_seed(5)
    v_cache, _ = _paged_cache(values, block_size, 12)
    query = torch.randn(len(lengths), heads, d, dtype=torch.float64)
    seq_lens = torch.tensor(lengths, dtype=torch.int32)
    set_batch_invariant(batch_invariant)
    try:
        out = _torch_ops.paged_decode_attention(
            query, k_cache, v_cache, tables, seq_lens, 13, scale, window, cap
        )
        chunk = torch.randn(7, heads, d, dtype=torch.float64)
        prefill = _torch_ops.prefill_attention(
            chunk, k_cache, v_cache, tables[2], 13, scale, window, cap
        )
    finally:
        set_batch_invariant(False)
    for i, n in enumerate(lengths):
        start = max(0, n - window) if window else 0
        expected = _dense_row(query[i], keys[i], values[i], heads, start, n, scale, cap)
        torch.testing.assert_close(out[i], expected)
    for j in range(7):
        end = 6 + j + 1
        start = max(0, end - window) if window else 0
        expected = _dense_row(chunk[j], keys[2], values[2], heads, start, end, scale, cap)
        torch.testing.assert_close(prefill[j], expected)
