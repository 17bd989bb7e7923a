"""SamplingMetadata.build against the per-row params it batches (vLLM's InputBatch fields)."""

import pytest
import torch

from pagedllm.sample.metadata import SamplingMetadata, SamplingRow
from pagedllm.sampling_params import SamplingParams

V = 10


def build(*rows: SamplingRow) -> SamplingMetadata:
    return SamplingMetadata.build(list(rows), V, "cpu")


def row(prompt: list[int] | None = None, output: list[int] | None = None, **kw) -> SamplingRow:
    params = SamplingParams(**kw)
    generator = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
    return SamplingRow(params, prompt or [], output or [], generator)


def test_all_greedy_batch_builds_nothing_to_skip() -> None:
    md = build(row(temperature=0), row(temperature=0, top_k=3))
    assert md.all_greedy and not md.all_random and md.no_penalties
    fields = (md.temperature, md.greedy_mask, md.top_k, md.top_p, md.output_token_counts)
    assert all(f is None for f in fields)
    assert md.allowed_token_ids_mask is None and md.bad_words_token_ids == {}
    assert md.generators == {} and md.max_num_logprobs is None
    assert md.token_bitmask is None and md.token_bitmask_rows is None
    assert md.argmax_only


@pytest.mark.parametrize(
    "kw",
    [
        dict(temperature=0.5),
        dict(repetition_penalty=1.2),
        dict(presence_penalty=0.5),
        dict(allowed_token_ids=[1, 2]),
        dict(logit_bias={3: 1.0}),
        dict(min_tokens=2),
        dict(logprobs=0),
    ],
)
def test_argmax_only_is_off_when_any_row_changes_or_reports_its_logits(kw: dict) -> None:
    """Each feature on one row of an otherwise plain greedy batch turns argmax_only off."""
    assert not build(row(temperature=0), row(**{"temperature": 0, **kw})).argmax_only


def test_mixed_batch_tensors() -> None:
    md = build(
        row(temperature=0),
        row(temperature=0.5, top_k=3, seed=1),
        row(top_p=0.9, top_k=V + 5, logprobs=2),
        row(logprobs=-1),
    )
    assert not md.all_greedy and not md.all_random
    assert md.temperature.tolist() == [1.0, 0.5, 1.0, 1.0]
    assert md.greedy_mask.tolist() == [True, False, False, False]
    assert md.top_k.tolist() == [V, 3, V, V]
    assert md.top_p.tolist() == pytest.approx([1.0, 1.0, 0.9, 1.0])
    assert list(md.generators) == [1] and md.max_num_logprobs == -1
    assert build(row(logprobs=0), row(logprobs=3)).max_num_logprobs == 3


def test_penalty_counts_only_for_the_rows_each_penalty_applies_to() -> None:
    """Reference: the (row, token, count) triples of each penalised row's tokens."""
    md = build(
        row([1, 2], [3, 3, 4], repetition_penalty=1.5),
        row([5], [6, 6], frequency_penalty=0.5),
        row([7], [8]),
    )
    assert not md.no_penalties
    triples = lambda c: list(zip(c.rows.tolist(), c.tokens.tolist(), c.counts.tolist()))  # noqa: E731
    assert triples(md.seen_token_counts) == [(0, 1, 1), (0, 2, 1), (0, 3, 2), (0, 4, 1)]
    assert triples(md.output_token_counts) == [(1, 6, 2)]
    assert md.repetition_penalties.tolist() == [1.5, 1.0, 1.0]
    assert md.frequency_penalties.tolist() == [0.0, 0.5, 0.0]
    assert build(row(presence_penalty=1.0)).seen_token_counts is None


def test_allowed_token_ids_mask_bans_everything_else_in_that_row() -> None:
    md = build(row(), row(allowed_token_ids=[2, 5]))
    mask = md.allowed_token_ids_mask
    assert not mask[0].any()
    assert (~mask[1]).nonzero().flatten().tolist() == [2, 5]


def test_bad_words_need_the_tokenizer_pass() -> None:
    params = SamplingParams(bad_words=["x"])
    params.bad_words_token_ids = [[4]]
    md = build(row(), SamplingRow(params, [], [1]))
    assert md.bad_words_token_ids == {1: [[4]]} and md.output_token_ids == [[], [1]]


def test_token_bitmasks_stack_only_the_constrained_rows() -> None:
    constrained = [row(), row(), row()]
    constrained[0].token_bitmask = torch.tensor([5], dtype=torch.int32)
    constrained[2].token_bitmask = torch.tensor([-1], dtype=torch.int32)
    md = build(*constrained)
    assert md.token_bitmask_rows.tolist() == [0, 2]
    assert md.token_bitmask.tolist() == [[5], [-1]] and md.token_bitmask.dtype == torch.int32


def _same_row(before: SamplingRow, output: list[int]) -> SamplingRow:
    """The row of the same request a step later: its params and generator, a longer output."""
    return SamplingRow(before.params, before.prompt_token_ids, output, before.generator)


def test_a_batch_of_the_same_requests_reuses_the_parameter_tensors() -> None:
    """The step after, with the same requests in the same order: the tensors that depend
    on the parameters alone are those of the step before; the penalty counts and the
    grammar's bitmasks are the new step's. Reference: a build without `previous`."""
    first = [
        row([1], [2], temperature=0.5, top_k=3, seed=1, repetition_penalty=1.5),
        row([5], [6], top_p=0.9, allowed_token_ids=[2, 5], logprobs=1),
    ]
    before = build(*first)
    rows = [_same_row(first[0], [2, 7]), _same_row(first[1], [6, 6])]
    rows[1].token_bitmask = torch.tensor([3], dtype=torch.int32)
    after = SamplingMetadata.build(rows, V, "cpu", previous=before)
    assert after.rows is rows
    for name in ("temperature", "top_k", "top_p", "allowed_token_ids_mask", "generators"):
        assert getattr(after, name) is getattr(before, name)
    fresh = SamplingMetadata.build(rows, V, "cpu")
    for name, value in vars(fresh).items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(getattr(after, name), value), name
        elif name != "seen_token_counts":
            assert getattr(after, name) == value, name
    counts = lambda c: (c.rows.tolist(), c.tokens.tolist(), c.counts.tolist())  # noqa: E731
    assert counts(after.seen_token_counts) == counts(fresh.seen_token_counts)
    assert counts(after.seen_token_counts) != counts(before.seen_token_counts)


@pytest.mark.parametrize("change", ["order", "params", "generator", "size"])
def test_a_changed_batch_builds_its_parameter_tensors_anew(change: str) -> None:
    """Rows reordered, one request replaced (even by equal parameters), a generator not the
    same object, a row more: nothing is taken from the step before."""
    first = [row(temperature=0.5, seed=1), row(temperature=0.7, top_k=2, seed=2)]
    rows = [_same_row(r, [1]) for r in first]
    if change == "order":
        rows.reverse()
    elif change == "params":
        rows[1] = row([], [1], temperature=0.7, top_k=2, seed=2)
    elif change == "generator":
        rows[0].generator = torch.Generator().manual_seed(1)
    else:
        rows.append(row([], [1], temperature=0.5))
    before = build(*first)
    after = SamplingMetadata.build(rows, V, "cpu", previous=before)
    assert after.temperature is not before.temperature
    assert after.generators == {i: r.generator for i, r in enumerate(rows) if r.generator}
    if change == "order":
        assert after.temperature.tolist() == pytest.approx([0.7, 0.5])
        assert after.top_k.tolist() == [2, V]
