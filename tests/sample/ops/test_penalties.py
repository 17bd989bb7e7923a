"""Penalties against transformers' RepetitionPenaltyLogitsProcessor and a numpy formula."""

import numpy as np
import torch
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

from pagedllm.sample.ops.penalties import TokenCounts, apply_penalties, get_token_counts

V = 16
CPU = torch.device("cpu")


def dense(counts: TokenCounts, num_rows: int) -> np.ndarray:
    out = torch.zeros(num_rows, V)
    out[counts.rows, counts.tokens] = counts.counts
    return out.numpy()


def test_token_counts_equal_numpy_bincount_and_drop_out_of_vocab() -> None:
    lists = [[1, 1, 3], [], [15, 0, 15, 15, 99, -1]]
    counts = get_token_counts(lists, V, CPU)
    expected = [np.bincount([t for t in ids if 0 <= t < V], minlength=V) for ids in lists]
    np.testing.assert_array_equal(dense(counts, 3), np.stack(expected))
    assert len(counts.rows) == 4  # each (row, token) once
    assert get_token_counts([[], []], V, CPU).rows.numel() == 0


def test_repetition_penalty_equals_transformers_over_prompt_and_output() -> None:
    """Reference: RepetitionPenaltyLogitsProcessor on prompt + output, row by row."""
    logits = torch.randn(3, V) * 3
    seen = [[1, 2, 2, 3], [5, 5, 9], [0, 7]]
    penalties = [1.3, 0.7, 2.0]
    zeros = torch.zeros(3)
    ours = apply_penalties(
        logits.clone(), get_token_counts(seen, V, CPU), None, zeros, zeros, torch.tensor(penalties)
    )
    for i in range(3):
        ref = RepetitionPenaltyLogitsProcessor(penalties[i])(
            torch.tensor([seen[i]]), logits[i : i + 1].clone()
        )
        torch.testing.assert_close(ours[i], ref[0])


def test_frequency_and_presence_equal_numpy_formula() -> None:
    """logits - f * count_in_output - p * (count_in_output > 0)."""
    logits = torch.randn(2, V)
    outputs = [[4, 4, 4, 1], [2]]
    freq, pres = np.array([0.5, -1.0]), np.array([1.5, 0.25])
    ours = apply_penalties(
        logits.clone(),
        None,
        get_token_counts(outputs, V, CPU),
        torch.tensor(pres, dtype=torch.float32),
        torch.tensor(freq, dtype=torch.float32),
        torch.ones(2),
    )
    c = np.stack([np.bincount(o, minlength=V) for o in outputs])
    expected = logits.numpy() - freq[:, None] * c - pres[:, None] * (c > 0)
    np.testing.assert_allclose(ours.numpy(), expected, rtol=1e-6, atol=1e-6)


def test_pending_tokens_count_as_one_more_output_token_each() -> None:
    """Rows whose last output token is still on the device (async scheduling): counted by
    `pending`, the penalties equal those of the counts with the token in the lists, whether
    the token was seen before (in the prompt, in the output) or not."""
    torch.manual_seed(0)
    prompts = [[1, 2, 3], [4, 5], [6], [7, 7]]
    outputs = [[3, 9], [10], [], [11, 12]]
    pending_rows, pending_tokens = [0, 1, 2], [9, 4, 13]  # in output; in prompt; new
    rep = torch.tensor([1.3, 0.8, 1.5, 1.2])
    freq = torch.tensor([0.5, -0.25, 1.0, 0.7])
    pres = torch.tensor([0.2, 1.0, 0.4, 0.1])
    logits = torch.randn(4, V) * 3
    after = [list(o) for o in outputs]
    for row, token in zip(pending_rows, pending_tokens, strict=True):
        after[row].append(token)

    def penalised(outs: list[list[int]], pending: tuple | None) -> torch.Tensor:
        seen = get_token_counts([p + o for p, o in zip(prompts, outs, strict=True)], V, CPU)
        counts = get_token_counts(outs, V, CPU)
        return apply_penalties(logits.clone(), seen, counts, pres, freq, rep, pending)

    pending = (torch.tensor(pending_rows), torch.tensor(pending_tokens))
    torch.testing.assert_close(penalised(outputs, pending), penalised(after, None))
