"""plan_step (pagedllm/engine/step_plan.py), checked by hand against its contract: each scheduled
sequence sends its chunk of new tokens; one that produces a token sends n sampler rows at its
request's first token (the n completions fork from it), one afterwards, each with its
completion's generator; prompt logits are asked only for chunks that still cover the prompt;
a pooling request's chunks are pooled, every one, and sample nothing."""

import torch

from pagedllm.core.scheduler import ScheduledSequence, SchedulerOutput
from pagedllm.core.sequence import Sequence, SequenceStatus, new_seq_id
from pagedllm.engine.pooling_request import PoolingRequest
from pagedllm.engine.request import Completion, Request
from pagedllm.engine.step_plan import plan_step
from pagedllm.executor.batch import SeqChunk
from pagedllm.pooling_params import PoolingParams
from pagedllm.sampling_params import SamplingParams


def make_request(rid: str, prompt: list[int], n: int = 1, **params: object) -> Request:
    request = Request(rid, None, prompt, SamplingParams(n=n, **params))
    request.generators = [torch.Generator().manual_seed(k) for k in range(n)]
    request.completions.append(Completion(0, make_seq(rid, prompt, []), None))
    return request


def make_seq(rid: str, prompt: list[int], output: list[int], computed: int = 0) -> Sequence:
    seq = Sequence(new_seq_id(), prompt, 4, request_id=rid)
    for token in output:
        seq.append_token(token)
    seq.num_computed_tokens = computed
    seq.block_table = list(range(seq.seq_id, seq.seq_id + seq.num_blocks))  # any distinct ids
    seq.status = SequenceStatus.RUNNING
    return seq


def test_first_token_samples_n_rows_and_prefill_asks_prompt_logits() -> None:
    a = make_request("a", [5, 6, 7, 8, 9], n=3)
    b = make_request("b", list(range(10, 20)), prompt_logprobs=1)
    a0, b0 = a.completions[0].seq, b.completions[0].seq
    out = SchedulerOutput([ScheduledSequence(a0, 5), ScheduledSequence(b0, 6)])
    out.blocks_to_copy = [(3, 4)]
    plan = plan_step(out, {"a": a, "b": b})
    step = plan.step_input
    assert step.chunks == [
        SeqChunk([5, 6, 7, 8, 9], 0, a0.block_table, ("a", a0.seq_id)),
        SeqChunk(list(range(10, 16)), 0, b0.block_table, ("b", b0.seq_id)),
    ]
    assert step.blocks_to_copy == [(3, 4)]
    assert step.sample_indices == [0, 0, 0] and plan.owners == [(0, 0), (0, 1), (0, 2)]
    assert step.prompt_logprob_indices == [1]
    assert [row.generator for row in plan.rows] == a.generators
    assert all(row.params is a.params for row in plan.rows)
    assert all((r.prompt_token_ids, r.output_token_ids) == ([5, 6, 7, 8, 9], []) for r in plan.rows)


def test_after_the_fork_each_completion_samples_one_row() -> None:
    """Scheduled in the order a1, b, a0, c, a2: rows follow the batch, each owned by its
    completion; b still prefills its prompt (prompt logits), c decodes (none)."""
    a = make_request("a", [5, 6, 7, 8, 9], n=3)
    a.completions = [
        Completion(k, make_seq("a", a.prompt_token_ids, [40 + k], 5), None) for k in range(3)
    ]
    b = make_request("b", list(range(10, 20)), prompt_logprobs=1)
    b.completions[0].seq.num_computed_tokens = 6
    c = make_request("c", [1, 2, 3], prompt_logprobs=0)
    c.completions = [Completion(0, make_seq("c", [1, 2, 3], [50], 3), None)]
    a0, a1, a2 = (comp.seq for comp in a.completions)
    seqs = [a1, b.completions[0].seq, a0, c.completions[0].seq, a2]
    out = SchedulerOutput(
        [ScheduledSequence(s, s.num_tokens - s.num_computed_tokens) for s in seqs]
    )
    plan = plan_step(out, {"a": a, "b": b, "c": c})
    assert [chunk.token_ids for chunk in plan.step_input.chunks] == [
        [41],
        [16, 17, 18, 19],
        [40],
        [50],
        [42],
    ]
    assert [chunk.start for chunk in plan.step_input.chunks] == [5, 6, 5, 3, 5]
    assert plan.owners == [(0, 1), (1, 0), (2, 0), (3, 0), (4, 2)]
    assert plan.step_input.sample_indices == [0, 1, 2, 3, 4]
    assert plan.step_input.prompt_logprob_indices == [1]
    generators = [
        a.generators[1],
        b.generators[0],
        a.generators[0],
        c.generators[0],
        a.generators[2],
    ]
    assert all(row.generator is g for row, g in zip(plan.rows, generators, strict=True))
    assert [row.output_token_ids for row in plan.rows] == [[41], [], [40], [50], [42]]


def test_a_prefill_chunk_that_does_not_reach_the_end_samples_nothing() -> None:
    a = make_request("a", list(range(10, 20)), n=2)
    plan = plan_step(SchedulerOutput([ScheduledSequence(a.completions[0].seq, 4)]), {"a": a})
    assert plan.rows == [] and plan.owners == [] and plan.step_input.sample_indices == []
    assert plan.step_input.prompt_logprob_indices == []


class FakeMatcher:
    """A completion's grammar state as plan_step sees it: something to build a mask from,
    active unless its completion is still in its reasoning part."""

    def __init__(self, is_active: bool = True) -> None:
        self.is_active = is_active


class FakeManager:
    """Hands out row i of the bitmask as [i], recording which matchers it was asked for."""

    def __init__(self) -> None:
        self.asked: list[list[FakeMatcher]] = []

    def grammar_bitmask(self, matchers: list[FakeMatcher]) -> torch.Tensor:
        self.asked.append(matchers)
        return torch.arange(len(matchers), dtype=torch.int32).unsqueeze(1)


def test_only_constrained_rows_get_a_bitmask_built_once_per_step() -> None:
    """Request a (n=2, constrained) samples its first token next to free request b: one
    bitmask call with a's two matchers; b's row carries none and costs nothing."""
    a = make_request("a", [5, 6, 7], n=2)
    a.matchers = [FakeMatcher(), FakeMatcher()]
    b = make_request("b", [8, 9])
    a0, b0 = a.completions[0].seq, b.completions[0].seq
    out = SchedulerOutput([ScheduledSequence(a0, 3), ScheduledSequence(b0, 2)])
    manager = FakeManager()
    plan = plan_step(out, {"a": a, "b": b}, manager)
    assert manager.asked == [a.matchers]
    assert [r.token_bitmask.tolist() for r in plan.rows[:2]] == [[0], [1]]
    assert plan.rows[2].token_bitmask is None
    free_only = plan_step(SchedulerOutput([ScheduledSequence(b0, 2)]), {"b": b}, manager)
    assert len(manager.asked) == 1 and free_only.rows[0].token_bitmask is None


def test_a_completion_in_its_reasoning_part_samples_free_then_under_its_mask() -> None:
    """Reasoning before structured outputs (vLLM's reasoner gate): the mask is not built or
    applied while the completion's matcher waits for the end of its reasoning, and is from
    the step after it has ended; the other completion's row is masked throughout."""
    request = make_request("a", [5, 6, 7], n=2)
    thinking, answering = FakeMatcher(is_active=False), FakeMatcher()
    request.matchers = [thinking, answering]
    manager = FakeManager()
    seq = request.completions[0].seq
    before = plan_step(SchedulerOutput([ScheduledSequence(seq, 3)]), {"a": request}, manager)
    assert manager.asked == [[answering]]
    assert before.rows[0].token_bitmask is None and before.rows[1].token_bitmask is not None
    thinking.is_active = True  # its output now holds the end of the reasoning part
    after = plan_step(SchedulerOutput([ScheduledSequence(seq, 3)]), {"a": request}, manager)
    assert manager.asked[-1] == [thinking, answering]
    assert all(row.token_bitmask is not None for row in after.rows)


def test_pooling_chunks_are_pooled_and_sample_nothing() -> None:
    prompt = list(range(10, 20))
    first = PoolingRequest("p", None, prompt, PoolingParams(), make_seq("p", prompt, []))
    last = PoolingRequest("q", None, prompt, PoolingParams(), make_seq("q", prompt, [], 6))
    out = SchedulerOutput([ScheduledSequence(first.seq, 6), ScheduledSequence(last.seq, 4)])
    plan = plan_step(out, {"p": first, "q": last})
    step = plan.step_input
    assert step.pool_indices == [0, 1]
    assert step.chunks[1] == SeqChunk(prompt[6:], 6, last.seq.block_table, ("q", last.seq.seq_id))
    assert step.sample_indices == [] and plan.rows == [] and step.prompt_logprob_indices == []


def test_a_chunk_that_reads_a_placeholder_takes_its_token_from_the_step_in_flight() -> None:
    """Async scheduling: a prompt's prefill is in flight (sampling its first token) when the
    sequence is scheduled again; its chunk is that token, a 0 in the batch, and
    placeholder_rows names the row of the step in flight that the runner reads it from."""
    a, b = make_request("a", [5, 6, 7]), make_request("b", [8, 9])
    a0, b0 = a.completions[0].seq, b.completions[0].seq
    a0.num_in_flight_tokens, a0.num_output_placeholders = 3, 1
    out = SchedulerOutput([ScheduledSequence(b0, 2), ScheduledSequence(a0, 1)])
    assert [s.reads_placeholder for s in out.scheduled] == [False, True]
    assert out.scheduled[1].start == 3 and out.scheduled[1].produces_token
    plan = plan_step(out, {"a": a, "b": b}, prev_rows={a0.seq_id: 4})
    chunks = plan.step_input.chunks
    assert [(c.token_ids, c.start) for c in chunks] == [([8, 9], 0), ([0], 3)]
    assert plan.step_input.placeholder_rows == [(1, 4)]
    assert plan.step_input.sample_indices == [0, 1] and plan.owners == [(0, 0), (1, 0)]


def test_drafts_follow_the_last_token_and_each_gets_a_row() -> None:
    """Speculative decoding: completion 1 of a verifies 2 drafts after its last token (3
    rows at offsets 2, 1, 0 from its chunk's end, owned by completion 1); b decodes; the
    offsets stay empty in a step without drafts."""
    a = make_request("a", [5, 6, 7, 8, 9], n=2)
    a.completions = [
        Completion(k, make_seq("a", a.prompt_token_ids, [40 + k], 5), None) for k in range(2)
    ]
    b = make_request("b", [1, 2, 3])
    b.completions = [Completion(0, make_seq("b", [1, 2, 3], [50], 3), None)]
    a1, b0 = a.completions[1].seq, b.completions[0].seq
    out = SchedulerOutput([ScheduledSequence(a1, 3, [7, 8]), ScheduledSequence(b0, 1)])
    plan = plan_step(out, {"a": a, "b": b})
    step = plan.step_input
    assert [(c.token_ids, c.start) for c in step.chunks] == [([41, 7, 8], 5), ([50], 3)]
    assert step.sample_indices == [0, 0, 0, 1] and step.sample_offsets == [2, 1, 0, 0]
    assert plan.owners == [(0, 1), (0, 1), (0, 1), (1, 0)]
    assert all(row.generator is a.generators[1] for row in plan.rows[:3])
    plain = plan_step(SchedulerOutput([ScheduledSequence(b0, 1)]), {"b": b})
    assert plain.step_input.sample_offsets == []
