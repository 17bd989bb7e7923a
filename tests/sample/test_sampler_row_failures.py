"""Sampler (pagedllm/sample/sampler.py) when a row cannot sample: by the definition of a
valid draw (a token whose logit is finite and not -inf), such rows get an error and the
others sample exactly as they would alone."""

import pytest
import torch

from pagedllm.sample.logits_processors import BatchUpdate, LogitsProcessor, process_dict_updates
from pagedllm.sample.sampler import PendingSamplerOutput, Sampler, _reject_unsampleable
from tests.sample.sampler_rows import V, row, sample


class FailOnFlag(LogitsProcessor):
    """Custom processor that raises (a bug in user code) when a row has extra_args["boom"]."""

    def __init__(self, vocab_size: int, device: torch.device, is_pin_memory: bool = False) -> None:
        super().__init__(vocab_size, device, is_pin_memory)
        self.rows: dict[int, bool] = {}

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        state = lambda p, _prompt, _out: (p.extra_args or {}).get("boom")  # noqa: E731
        process_dict_updates(self.rows, batch_update, state)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if self.rows:
            raise RuntimeError("boom")
        return logits


def test_unsampleable_rows_fail_alone() -> None:
    """A row with no token left (every logit -inf) and a row with a NaN logit get an
    error; the other rows sample as if alone."""
    logits = torch.randn(4, V)
    logits[1] = float("-inf")
    logits[3, 5] = float("nan")
    rows = [row([1], [], temperature=0, logprobs=2) for _ in range(4)]
    out = sample(Sampler(V), logits, rows)
    assert sorted(out.errors) == [1, 3]
    assert all("no token can be sampled" in str(e) for e in out.errors.values())
    assert out.sampled_token_ids[[1, 3]].tolist() == [0, 0]
    expected = logits[[0, 2]].argmax(dim=-1).tolist()
    assert out.sampled_token_ids[[0, 2]].tolist() == expected
    assert out.logprobs.logprob_token_ids.shape == (4, 3)


def test_a_token_outside_the_vocabulary_is_rejected() -> None:
    """A draw that landed outside [0, V) (no sampler here should make one) is an error for
    that row, never an index into the logits or the vocabulary."""
    logits = torch.randn(4, V)
    sampled = torch.tensor([2, V, -1, 7])
    tokens, errors = _reject_unsampleable(sampled, logits)
    assert sorted(errors) == [1, 2] and tokens.tolist() == [2, 0, 0, 7]
    assert sampled.tolist() == [2, V, -1, 7]  # the caller's tensor is left as it was


def test_random_row_overflowing_to_nan_fails_alone() -> None:
    """+inf logits make softmax NaN: that row errors, a seeded neighbour keeps its token."""
    logits = torch.randn(2, V)
    logits[0, 3] = float("inf")
    logits[0, 4] = float("inf")
    rows = [row([1], [], temperature=1.0), row([1], [], temperature=0.8, seed=4)]
    out = sample(Sampler(V), logits, rows)
    alone = sample(Sampler(V), logits[1:], [row([1], [], temperature=0.8, seed=4)])
    assert list(out.errors) == [0]
    assert out.sampled_token_ids[1] == alone.sampled_token_ids[0]


def test_custom_processor_failing_for_one_row_fails_only_that_row() -> None:
    """The batch fails, so each row is sampled alone from the saved logits."""
    logits = torch.randn(3, V)
    rows = [row([1], [], temperature=0, logprobs=1) for _ in range(3)]
    rows[1].params.extra_args = {"boom": True}
    out = sample(Sampler(V, logits_processors=[FailOnFlag]), logits, rows)
    assert list(out.errors) == [1] and "boom" in str(out.errors[1])
    assert out.sampled_token_ids[[0, 2]].tolist() == logits[[0, 2]].argmax(dim=-1).tolist()
    assert out.logprobs.logprob_token_ids.shape == (3, 2)


def test_rows_sampled_alone_leave_their_ids_on_the_samplers_device(monkeypatch) -> None:
    """Off the CPU each row sampled alone is waited for, so the rows come back on the host;
    the ids the next step's placeholders read (async scheduling) go back to the device."""
    devices = []
    ready = PendingSamplerOutput.ready.__func__

    def spy(cls, output, device=None):
        devices.append(device)
        return ready(cls, output, device)

    monkeypatch.setattr(PendingSamplerOutput, "ready", classmethod(spy))
    rows = [row([1], [], temperature=0) for _ in range(2)]
    rows[1].params.extra_args = {"boom": True}
    sampler = Sampler(V, logits_processors=[FailOnFlag])
    sample(sampler, torch.randn(2, V), rows)
    assert devices[-1] == sampler.device
    out = sample(Sampler(V), torch.randn(2, V), [row([1], []), row([2], [])])
    moved = PendingSamplerOutput.ready(out, torch.device("meta"))
    assert moved.sampled_on_device.device.type == "meta" and moved.result() is out


def test_without_custom_processors_a_failure_is_the_batchs() -> None:
    sampler = Sampler(V)
    sampler.apply_logits_processors = lambda *_: 1 / 0
    with pytest.raises(ZeroDivisionError):
        sample(sampler, torch.randn(2, V), [row([1], []), row([2], [])])
