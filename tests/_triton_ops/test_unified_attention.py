"""Unified paged attention (pagedllm/_triton_ops/unified_attention.py) on a GPU, else under
Triton's interpreter. Reference: the torch reference (_torch_ops.prefill_attention per sequence, in
float32; with a sliding window or a soft cap, also the formula written out as a dense masked
softmax) on the same random paged batch."""

import pytest
import torch

from tests._triton_ops.paged_batches import PagedBatch, dense_reference, make_batch, reference

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 3e-2, torch.float16: 3e-3}

# A mixed batch: a decode ending mid-block, a chunk after a cached prefix (ending mid-block),
# a whole prompt from position 0, and a decode whose sequence ends exactly on a block.
MIXED = ([1, 9, 21, 1], [37, 41, 21, 64])


def run(batch: PagedBatch, **kwargs: object) -> torch.Tensor:
    from pagedllm._triton_ops.unified_attention import unified_attention

    return unified_attention(
        batch.query,
        batch.k_cache,
        batch.v_cache,
        batch.query_start_loc,
        batch.seq_lens,
        batch.block_tables,
        batch.max_query_len,
        batch.max_seq_len,
        batch.scale,
        **kwargs,
    )


def check(
    batch: PagedBatch, out: torch.Tensor, sliding_window: int = 0, logits_soft_cap: float = 0.0
) -> None:
    assert out.dtype == batch.query.dtype and out.shape == batch.query.shape
    tol = TOLERANCE[batch.query.dtype]
    options = (sliding_window, logits_soft_cap)
    references = [reference] + ([dense_reference] if any(options) else [])
    for expected in references:
        torch.testing.assert_close(out.cpu().float(), expected(batch, *options), rtol=tol, atol=tol)


@pytest.mark.parametrize(
    "block_size,num_heads,num_kv_heads,head_size,dtype",
    [
        (16, 4, 4, 64, torch.float32),
        (32, 8, 2, 128, torch.bfloat16),
        (16, 8, 1, 128, torch.float32),
        (32, 4, 4, 64, torch.bfloat16),
        (16, 8, 2, 64, torch.float16),
        (32, 8, 1, 64, torch.float32),
    ],
)
def test_a_mixed_batch_matches_the_reference(
    triton_device: torch.device,
    block_size: int,
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    dtype: torch.dtype,
) -> None:
    """Block sizes 16/32, GQA ratios 1/4/8, head sizes 64/128, float32/bf16/fp16: decodes
    and prefill chunks (after cached context or not) in one launch, unsplit."""
    batch = make_batch(
        *MIXED, num_heads, num_kv_heads, head_size, block_size, dtype, triton_device, seed=3
    )
    check(batch, run(batch, num_kv_splits=1))


@pytest.mark.parametrize(
    "block_size,num_heads,num_kv_heads,dtype,splits",
    [
        (16, 8, 1, torch.float32, 16),
        (32, 4, 4, torch.bfloat16, 4),
        (16, 8, 2, torch.bfloat16, 4),
    ],
)
def test_split_context_decodes_match_the_reference_and_the_unsplit_kernel(
    triton_device: torch.device,
    block_size: int,
    num_heads: int,
    num_kv_heads: int,
    dtype: torch.dtype,
    splits: int,
) -> None:
    """Split-K on (some segments left empty by the shorter sequences) and off."""
    batch = make_batch(
        [1, 1, 1], [100, 7, 65], num_heads, num_kv_heads, 64, block_size, dtype, triton_device
    )
    unsplit = run(batch, num_kv_splits=1)
    check(batch, unsplit)
    split = run(batch, num_kv_splits=splits)
    check(batch, split)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(split, unsplit, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_an_fp8_cache_matches_the_reference_on_the_same_cache(
    triton_device: torch.device, dtype: torch.dtype
) -> None:
    """kv_cache_dtype="fp8": keys and values read as float8 e4m3, widened on load."""
    batch = make_batch(*MIXED, 8, 2, 64, 16, dtype, triton_device, 6, torch.float8_e4m3fn)
    check(batch, run(batch, num_kv_splits=1))


def test_a_split_chunked_prefill_matches_the_reference(triton_device: torch.device) -> None:
    """The split also serves prefill chunks (rows whose causal limit ends mid-context)."""
    batch = make_batch(*MIXED, 8, 2, 64, 16, torch.float32, triton_device, seed=4)
    check(batch, run(batch, num_kv_splits=4))


@pytest.mark.parametrize("num_kv_splits", [1, 4])
@pytest.mark.parametrize("sliding_window, logits_soft_cap", [(20, 0.0), (0, 1.5), (20, 1.5)])
def test_a_window_and_a_soft_cap_match_the_references(
    triton_device: torch.device, sliding_window: int, logits_soft_cap: float, num_kv_splits: int
) -> None:
    """Window 20: keys more than 19 positions back are hidden, tiles before it skipped. Cap
    1.5: scores s (about unit variance here) become 1.5 tanh(s / 1.5). A mixed batch of
    decodes and prefill chunks, unsplit and split."""
    batch = make_batch(*MIXED, 8, 2, 64, 16, torch.float32, triton_device, seed=5)
    out = run(
        batch,
        sliding_window=sliding_window,
        logits_soft_cap=logits_soft_cap,
        num_kv_splits=num_kv_splits,
    )
    check(batch, out, sliding_window, logits_soft_cap)
    assert not torch.allclose(out.cpu(), reference(batch), atol=1e-3)


def test_split_decodes_with_a_window_and_a_soft_cap_match_the_unsplit_kernel(
    triton_device: torch.device,
) -> None:
    """bf16, GQA 4: window 40 leaves the long decode's first segments without a key."""
    batch = make_batch([1, 1, 1], [100, 7, 65], 8, 2, 64, 16, torch.bfloat16, triton_device)
    options = dict(sliding_window=40, logits_soft_cap=2.0)
    unsplit = run(batch, num_kv_splits=1, **options)
    split = run(batch, num_kv_splits=4, **options)
    check(batch, unsplit, 40, 2.0)
    check(batch, split, 40, 2.0)
    torch.testing.assert_close(split, unsplit, rtol=3e-2, atol=3e-2)


def test_a_soft_cap_saturates_huge_scores_without_overflow(triton_device: torch.device) -> None:
    """Scores near 1e3 with cap 5 (s / c near 200, where exp overflows float32): each
    capped score is +-5 within float32 rounding, no inf / inf."""
    batch = make_batch(*MIXED, 4, 4, 64, 16, torch.float32, triton_device, seed=8)
    batch.scale = 100.0
    out = run(batch, logits_soft_cap=5.0, num_kv_splits=1)
    assert out.isfinite().all()
    check(batch, out, logits_soft_cap=5.0)


def test_the_default_split_is_for_few_long_decodes(triton_device: torch.device) -> None:
    from pagedllm._triton_ops.unified_attention import default_num_kv_splits

    assert default_num_kv_splits(1, 4096, 2, 8) == 16
    assert default_num_kv_splits(1, 100, 2, 8) == 1  # short context
    assert default_num_kv_splits(7, 4096, 2, 8) == 1  # a prefill chunk in the batch
    assert default_num_kv_splits(1, 4096, 64, 8) == 1  # enough programs already


def test_bad_splits_and_head_counts_are_named(triton_device: torch.device) -> None:
    batch = make_batch([1], [5], 4, 4, 64, 16, torch.float32, triton_device)
    with pytest.raises(ValueError, match="power of two"):
        run(batch, num_kv_splits=3)
    batch.query = batch.query[:, :3]
    with pytest.raises(ValueError, match="not a multiple"):
        run(batch)


def test_in_batch_invariant_mode_each_row_is_the_bits_of_its_token_alone(
    triton_device: torch.device,
) -> None:
    """Reference: each token attended alone, as a decode over its prefix, in a batch of its
    own: batch-invariant mode never splits the context, so even a long decode beside others
    gets its bits alone."""
    from pagedllm.batch_invariant import set_batch_invariant

    batch = make_batch([1, 6, 1], [600, 20, 9], 8, 2, 64, 16, torch.float32, triton_device)
    set_batch_invariant(True)
    try:
        out = run(batch)
        row = 0
        for i, (q_len, seq_len) in enumerate(zip(batch.query_lens, batch.seq_lens_list)):
            for pos in range(seq_len - q_len, seq_len):
                alone = PagedBatch(
                    query=batch.query[row : row + 1],
                    k_cache=batch.k_cache,
                    v_cache=batch.v_cache,
                    query_start_loc=torch.tensor([0, 1], dtype=torch.int32, device=triton_device),
                    seq_lens=torch.tensor([pos + 1], dtype=torch.int32, device=triton_device),
                    block_tables=batch.block_tables[i : i + 1],
                    query_lens=[1],
                    seq_lens_list=[pos + 1],
                    scale=batch.scale,
                )
                assert torch.equal(out[row], run(alone)[0]), (i, pos)
                row += 1
    finally:
        set_batch_invariant(False)
