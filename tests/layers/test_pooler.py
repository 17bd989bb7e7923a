"""layers/pooler.py: pooling chunk by chunk equals pooling the whole prompt at once.
Reference: the definitions (LAST: the last row, MEAN: the mean of the rows, CLS: the
first row; ALL: every row; L2 normalisation after Matryoshka truncation) on random hidden
states."""

import pytest
import torch
import torch.nn.functional as F

from pagedllm.layers.pooler import accumulate, finish_pooling, pool_chunk

WHOLE = {
    "LAST": lambda h: h[-1],
    "MEAN": lambda h: h.mean(dim=0),
    "CLS": lambda h: h[0],
}


def pool_in_chunks(hidden: torch.Tensor, bounds: list[int], pooling_type: str) -> torch.Tensor:
    pooled = None
    for start, end in zip(bounds, bounds[1:]):
        partial = pool_chunk(hidden[start:end], start, pooling_type)
        if partial is not None:
            pooled = accumulate(pooled, partial, start, pooling_type)
    return pooled


@pytest.mark.parametrize("pooling_type", ["LAST", "MEAN", "CLS"])
@pytest.mark.parametrize("bounds", [[0, 50], [0, 1, 50], [0, 16, 32, 48, 50], [0, 49, 50]])
def test_chunks_pool_as_the_whole_prompt(pooling_type: str, bounds: list[int]) -> None:
    hidden = torch.randn(50, 24)
    pooled = pool_in_chunks(hidden, bounds, pooling_type)
    got = finish_pooling(pooled, 50, pooling_type, normalize=True)
    expected = F.normalize(WHOLE[pooling_type](hidden), dim=-1)
    assert got == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("pooling_type", ["LAST", "MEAN", "CLS"])
def test_a_vector_is_the_same_bits_however_the_prompt_is_chunked(pooling_type: str) -> None:
    """docs/determinism.md: the batch's budget decides where a prompt's chunks end, and the
    vector must not depend on it (a sum per chunk, then of the sums, would)."""
    hidden = torch.randn(300, 64, generator=torch.Generator().manual_seed(0))
    whole = finish_pooling(pool_in_chunks(hidden, [0, 300], pooling_type), 300, pooling_type, False)
    for bounds in ([0, 16, 32, 300], [0, 7, 150, 299, 300], [0, *range(13, 300, 13), 300]):
        pooled = pool_in_chunks(hidden, bounds, pooling_type)
        assert finish_pooling(pooled, 300, pooling_type, False).equal(whole), bounds


def test_a_chunk_at_position_zero_restarts_the_mean() -> None:
    """A preempted prompt is recomputed from its start: the old sums are dropped."""
    hidden = torch.randn(10, 8)
    stale = pool_in_chunks(hidden, [0, 5], "MEAN")
    pooled = accumulate(stale, pool_chunk(hidden[:10], 0, "MEAN"), 0, "MEAN")
    assert finish_pooling(pooled, 10, "MEAN", False) == pytest.approx(hidden.mean(0), abs=1e-6)


def test_dimensions_truncate_before_normalising() -> None:
    vector = torch.randn(16)
    got = finish_pooling(vector, 1, "LAST", normalize=True, dimensions=4)
    assert got == pytest.approx(F.normalize(vector[:4], dim=-1), abs=1e-7)
    assert finish_pooling(vector, 1, "LAST", normalize=False, dimensions=4).equal(vector[:4])


@pytest.mark.parametrize("bounds", [[0, 50], [0, 1, 50], [0, 16, 32, 48, 50], [0, 49, 50]])
def test_all_keeps_every_row_however_the_prompt_is_chunked(bounds: list[int]) -> None:
    """A token classifier's pooling: the prompt's rows [T, H], in order, whatever the
    chunks (a restart at position 0 drops the stale rows, as MEAN's)."""
    hidden = torch.randn(50, 24)
    stale = pool_in_chunks(hidden, [0, 10], "ALL")
    pooled = accumulate(stale, pool_chunk(hidden[: bounds[1]], 0, "ALL"), 0, "ALL")
    for start, end in zip(bounds[1:], bounds[2:]):
        pooled = accumulate(pooled, pool_chunk(hidden[start:end], start, "ALL"), start, "ALL")
    assert finish_pooling(pooled, 50, "ALL", normalize=False).equal(hidden)
