"""The pipeline's sampling rank keeps each row's state; each step sends it only what changed.

Under pipeline parallelism rank 0 plans the step and the last stage samples. A row's
sampler state (its SamplingParams, prompt and output token ids for penalties, bad words
and logits processors, and its seeded generator) is sent in full once, as a NewRow (vLLM's
NewRequestData), and kept by the sampling rank (PersistentRows) under the row's key
`(request id, completion index)`. Each later step sends a CachedRow (vLLM's
CachedRequestData): the output tokens appended since, a few ids, whatever the context
length. Rank 0's RowDeltaSender remembers how many output tokens the sampling rank holds
for each key; both sides read the same messages in the same order, so they agree.

A row's state changes only by appending: token ids only grow, and a seeded generator
advances only where it samples, on the sampling rank. A preempted request therefore keeps
its state there and resumes with deltas, as vLLM's workers keep a preempted request's
CachedRequestState. The state goes when the request ends (`StepInput.finished_req_ids`,
vLLM's `finished_req_ids`), before the step's rows are read, so a later request may reuse
the id. From a row's first step on its generator lives on the sampling rank: rank 0's
copy stays at its seed.
"""

import dataclasses
from dataclasses import dataclass

import torch

from pagedllm.sample.metadata import RowKey, SamplingRow


@dataclass
class NewRow:
    """A row the sampling rank has not seen: all of it, its generator as its state (a
    generator is bound to its device, so the sampling rank rebuilds it on its own)."""

    row: SamplingRow  # without its generator
    generator_state: torch.Tensor | None

    @classmethod
    def of(cls, row: SamplingRow) -> "NewRow":
        state = None if row.generator is None else row.generator.get_state()
        return cls(dataclasses.replace(row, generator=None), state)


@dataclass
class CachedRow:
    """A row the sampling rank holds: the output token ids appended since its last step,
    and this step's grammar bitmask [W] (None for an unconstrained row)."""

    key: RowKey
    new_token_ids: list[int]
    token_bitmask: torch.Tensor | None = None


RowDelta = NewRow | CachedRow


class RowDeltaSender:
    """Rank 0: turns each step's rows into what the sampling rank lacks."""

    def __init__(self) -> None:
        self.num_output_tokens: dict[RowKey, int] = {}  # what the sampling rank holds

    def deltas(self, rows: list[SamplingRow], finished_req_ids: set[str]) -> list[RowDelta]:
        """The step's rows, in order; `finished_req_ids`: requests ended since the last step."""
        forget(self.num_output_tokens, finished_req_ids)
        return [self._delta(row) for row in rows]

    def _delta(self, row: SamplingRow) -> RowDelta:
        assert row.key is not None, "a pipeline's sampler rows need their keys"
        output = row.output_token_ids
        sent = self.num_output_tokens.get(row.key)
        self.num_output_tokens[row.key] = len(output)
        if sent is None:
            return NewRow.of(row)
        assert sent <= len(output), f"row {row.key}: its output token ids only grow"
        return CachedRow(row.key, output[sent:], row.token_bitmask)


class PersistentRows:
    """The sampling rank: every running row's state, kept across steps."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.rows: dict[RowKey, SamplingRow] = {}

    def apply(self, deltas: list[RowDelta], finished_req_ids: set[str]) -> list[SamplingRow]:
        """The step's rows, brought up to date by `deltas` (the same arguments, in the same
        order, as the sender's)."""
        forget(self.rows, finished_req_ids)
        return [self._apply(delta) for delta in deltas]

    def _apply(self, delta: RowDelta) -> SamplingRow:
        if isinstance(delta, NewRow):
            return self._add(delta)
        row = self.rows[delta.key]
        row.output_token_ids.extend(delta.new_token_ids)
        row.token_bitmask = delta.token_bitmask
        return row

    def _add(self, new: NewRow) -> SamplingRow:
        """A message's rows may share lists (a request's n first rows share the parent's
        prompt and outputs): each row gets its own output list, which grows."""
        row = dataclasses.replace(new.row, output_token_ids=list(new.row.output_token_ids))
        if new.generator_state is not None:
            row.generator = torch.Generator(self.device)
            row.generator.set_state(new.generator_state.cpu())
        self.rows[row.key] = row
        return row


def forget(states: dict[RowKey, object], finished_req_ids: set[str]) -> None:
    """Drop the states of the finished requests' rows (every completion's)."""
    if not finished_req_ids:
        return
    for key in [key for key in states if key[0] in finished_req_ids]:
        del states[key]
