"""Top-k / top-p against transformers' TopKLogitsWarper and TopPLogitsWarper, row by row."""

import pytest
import torch
from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

from pagedllm.sample.ops.row_chunks import ROW_CHUNK
from pagedllm.sample.ops.top_k_top_p import apply_top_k_top_p, apply_top_k_top_p_sorted

V = 32


def reference(logits: torch.Tensor, ks: list[int], ps: list[float]) -> torch.Tensor:
    rows = []
    for row, k, p in zip(logits, ks, ps, strict=True):
        x = row[None].clone()
        if k < logits.shape[1]:
            x = TopKLogitsWarper(k)(None, x)
        if p < 1.0:
            x = TopPLogitsWarper(p)(None, x)
        rows.append(x[0])
    return torch.stack(rows)


@pytest.mark.parametrize(
    ("ks", "ps"),
    [
        ([1, 5, V, 31], None),
        (None, [0.1, 0.5, 0.9, 1.0]),
        ([3, V, 10, 1], [0.5, 0.8, 1.0, 0.3]),
    ],
)
def test_matches_transformers_warpers(ks: list[int] | None, ps: list[float] | None) -> None:
    logits = torch.randn(4, V) * 2
    k = None if ks is None else torch.tensor(ks)
    p = None if ps is None else torch.tensor(ps)
    ours = apply_top_k_top_p(logits.clone(), k, p)
    expected = reference(logits, ks or [V] * 4, ps or [1.0] * 4)
    torch.testing.assert_close(ours, expected)


def test_batches_longer_than_a_row_chunk_match_row_by_row() -> None:
    """40 rows (2.5 chunks of ROW_CHUNK), each with its own k and p."""
    assert 40 > 2 * ROW_CHUNK
    torch.manual_seed(0)
    logits = torch.randn(40, V) * 2
    ks = torch.randint(1, V + 1, (40,)).tolist()
    ps = torch.rand(40).clamp(0.05, 1.0).tolist()
    ours = apply_top_k_top_p(logits.clone(), torch.tensor(ks), torch.tensor(ps))
    torch.testing.assert_close(ours, reference(logits, ks, ps))


def test_top_p_nucleus_larger_than_the_candidates_falls_back_to_a_sort() -> None:
    """Row 0 flat (nucleus ~2700 of 3000 tokens), row 1 peaked: both as transformers."""
    logits = torch.randn(2, 3000) * torch.tensor([[0.1], [4.0]])
    ps = [0.9, 0.9]
    ours = apply_top_k_top_p(logits.clone(), None, torch.tensor(ps))
    assert int(ours[0].isfinite().sum()) > 2000
    torch.testing.assert_close(ours, reference(logits, [3000, 3000], ps))


def test_ties_are_kept_at_the_top_k_and_top_p_boundaries() -> None:
    """Top-k as TopKLogitsWarper keeps every token equal to the k-th largest; top-p keeps
    all tokens tied with the last one its nucleus needs."""
    logits = torch.tensor([[3.0, 1.0, 2.0, 2.0, 0.0]])
    ours = apply_top_k_top_p(logits.clone(), torch.tensor([2]), None)
    assert ours.isfinite().tolist() == [[True, False, True, True, False]]
    ours = apply_top_k_top_p(logits.clone(), None, torch.tensor([0.7]))
    assert ours.isfinite().tolist() == [[True, False, True, True, False]]


def test_nothing_asked_returns_logits_unchanged() -> None:
    logits = torch.randn(2, V)
    assert torch.equal(apply_top_k_top_p(logits.clone(), None, None), logits)


@pytest.mark.parametrize(("k_max", "p_min"), [(V, 0.0), (8, 0.5), (1, 0.99)])
def test_sorting_every_row_gives_the_same_filter(k_max: int, p_min: float) -> None:
    """apply_top_k_top_p_sorted (the accelerators' path) against the CPU's candidate path,
    on 2 * ROW_CHUNK rows of a vocabulary wider than its 1024 candidates, with ties."""
    torch.manual_seed(3)
    rows, vocab = 2 * ROW_CHUNK, 1500
    logits = torch.randn(rows, vocab).round(decimals=1) * torch.rand(rows, 1) * 4
    k = torch.randint(1, k_max + 1, (rows,))
    k[::3] = vocab
    p = torch.rand(rows) * (1 - p_min) + p_min
    p[::4] = 1.0
    expected = apply_top_k_top_p(logits.clone(), k, p)
    torch.testing.assert_close(apply_top_k_top_p_sorted(logits.clone(), k, p), expected)
    expected = apply_top_k_top_p(logits.clone(), None, p)
    torch.testing.assert_close(apply_top_k_top_p_sorted(logits.clone(), None, p), expected)
