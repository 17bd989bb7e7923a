"""Row deltas (pagedllm/executor/row_deltas.py). Reference: the rows rank 0 plans each step:
passed through the wire's serialization (point_to_point.py), the sampling rank's rows equal
them step after step (params, prompt, outputs, bitmask), its generators go on from their
seeds, a finished request's id can be reused, and a running row's message is the same
size at any context length."""

import random

import torch

from pagedllm.distributed.point_to_point import dump_object, load_object
from pagedllm.executor.row_deltas import CachedRow, NewRow, PersistentRows, RowDeltaSender
from pagedllm.sample.metadata import SamplingRow
from pagedllm.sampling_params import SamplingParams

PARAMS = SamplingParams(temperature=1.0, seed=7, repetition_penalty=1.2, n=2)


class Wire:
    """Rank 0's sender and the sampling rank's rows, with the message serialized between."""

    def __init__(self) -> None:
        self.sender = RowDeltaSender()
        self.receiver = PersistentRows(torch.device("cpu"))
        self.sizes: list[int] = []

    def step(self, rows: list[SamplingRow], finished: set[str] = frozenset()) -> list:
        payload = dump_object(self.sender.deltas(rows, set(finished)))
        self.sizes.append(payload.numel())
        return self.receiver.apply(load_object(payload), set(finished))


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def assert_rows_equal(got: list[SamplingRow], want: list[SamplingRow]) -> None:
    for g, w in zip(got, want, strict=True):
        assert (g.key, g.params, g.prompt_token_ids) == (w.key, w.params, w.prompt_token_ids)
        assert g.output_token_ids == w.output_token_ids
        assert (g.token_bitmask is None) == (w.token_bitmask is None)
        if w.token_bitmask is not None:
            assert torch.equal(g.token_bitmask, w.token_bitmask)


def test_the_sampling_ranks_rows_follow_rank_0s_over_steps() -> None:
    wire, prompt = Wire(), [5, 6, 7]
    outputs: list[list[int]] = [[], []]
    masks = [None, torch.tensor([3], dtype=torch.int32)]
    first = [
        SamplingRow(PARAMS, prompt, outputs[0], seeded(7 + k), masks[k], ("a", k)) for k in range(2)
    ]
    got = wire.step(first)  # a request's n first rows share its prompt and outputs
    assert_rows_equal(got, first)
    generator = got[0].generator
    samples = [torch.rand(1, generator=row.generator).item() for row in got]
    assert samples == [torch.rand(1, generator=seeded(7 + k)).item() for k in range(2)]
    outputs = [[11], [12]]
    for step in range(3):
        mask = torch.tensor([step], dtype=torch.int32)
        rows = [
            SamplingRow(PARAMS, prompt, outputs[k], None, mask if k else None, ("a", k))
            for k in range(2)
        ]
        got = wire.step(rows)
        assert_rows_equal(got, rows)
        assert got[0].generator is generator  # kept, as it was left
        outputs = [out + [20 + step] for out in outputs]
    once = seeded(7)
    torch.rand(1, generator=once)
    assert torch.equal(generator.get_state(), once.get_state())
    again = [SamplingRow(SamplingParams(), [9], [], key=("a", 0))]
    assert_rows_equal(wire.step(again, {"a"}), again)  # a new request "a": full, once more
    assert list(wire.receiver.rows) == [("a", 0)] == list(wire.sender.num_output_tokens)


def test_deltas_are_full_rows_once_then_new_tokens_only() -> None:
    sender = RowDeltaSender()
    row = SamplingRow(PARAMS, [5, 6], [], key=("a", 0))
    (new,) = sender.deltas([row], set())
    assert isinstance(new, NewRow) and new.row.prompt_token_ids == [5, 6]
    row.output_token_ids = [8, 9]
    (cached,) = sender.deltas([row], set())
    assert cached == CachedRow(("a", 0), [8, 9])
    (resumed,) = sender.deltas([row], set())  # preempted and back: nothing new, nothing sent
    assert resumed == CachedRow(("a", 0), [])


def test_a_running_rows_message_does_not_grow_with_its_context() -> None:
    """Decode steps of one request at 10 and 20,000 prompt tokens (ids as a 150k vocabulary
    spreads them): after its first step, the same bytes on the wire."""
    token_ids = random.Random(0).choices(range(150_000), k=20_000)
    sizes = []
    for length in (10, 20_000):
        wire = Wire()
        row = SamplingRow(PARAMS, token_ids[:length], [], seeded(0), key=("request-0", 0))
        for step in range(3):
            row.output_token_ids = row.output_token_ids + [149_999 - step]
            wire.step([row])
        sizes.append(wire.sizes)
    short, long = sizes
    assert long[0] > short[0] + 3 * 20_000  # the full row: every prompt id, once
    assert long[1:] == short[1:]
