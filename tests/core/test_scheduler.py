"""Scheduler: continuous batching, chunked prefill and preemption, checked with a fake engine.

The fake model samples token 1000 * step + seq_id, and the fake paged KV cache stores token
ids in block slots: every step checks that each scheduled sequence finds its own tokens
[0, num_computed_tokens) through its block table, which catches wrong prefix-cache hits,
missing copy-on-write and blocks freed too early. Budgets are the vLLM v1 policy.
"""

import random

import pytest

from pagedllm.config import SchedulerConfig
from pagedllm.core.block_manager import BlockManager
from pagedllm.core.scheduler import Scheduler, SchedulerOutput
from pagedllm.core.sequence import Sequence, SequenceStatus


class FakeEngine:
    def __init__(
        self,
        num_blocks: int = 64,
        block_size: int = 4,
        max_num_seqs: int = 8,
        max_num_batched_tokens: int = 16,
        enable_chunked_prefill: bool = True,
        policy: str = "fcfs",
    ) -> None:
        self.bm = BlockManager(num_blocks, block_size)
        config = SchedulerConfig(
            max_num_seqs, max_num_batched_tokens, enable_chunked_prefill, policy=policy
        )
        self.scheduler = Scheduler(config, self.bm)
        self.kv: list[list[int | None]] = [[None] * block_size for _ in range(num_blocks)]
        self.seqs: list[Sequence] = []
        self.num_steps = 0

    def add(self, prompt: list[int], max_tokens: int, priority: int = 0) -> Sequence:
        """A sequence arriving now (its arrival time: its index)."""
        seq_id = len(self.seqs)
        seq = Sequence(seq_id, prompt, self.bm.block_size, max_tokens, None, seq_id, priority)
        self.seqs.append(seq)
        self.scheduler.add_seq(seq)
        return seq

    def step(self) -> SchedulerOutput:
        out = self.scheduler.schedule()
        self.check_output(out)
        self.run_model(out)
        self.scheduler.update_after_step(out.scheduled)
        for s in out.scheduled:
            if s.produces_token:
                s.seq.append_token(1000 * self.num_steps + s.seq.seq_id)
                if s.seq.num_output_tokens >= s.seq.sampling_params:
                    self.scheduler.finish_seq(s.seq, SequenceStatus.FINISHED_LENGTH)
        self.num_steps += 1
        self.check_state()
        return out

    def run_to_completion(self, max_steps: int = 10_000) -> None:
        while self.scheduler.has_unfinished_seqs():
            assert self.num_steps < max_steps, "scheduler made no progress"
            self.step()

    def slot(self, seq: Sequence, pos: int) -> tuple[int, int]:
        return seq.block_table[pos // self.bm.block_size], pos % self.bm.block_size

    def run_model(self, out: SchedulerOutput) -> None:
        for src, dst in out.blocks_to_copy:
            self.kv[dst] = list(self.kv[src])
        for s in out.scheduled:
            seq, start = s.seq, s.seq.num_computed_tokens
            for pos in range(start):
                block, offset = self.slot(seq, pos)
                assert self.kv[block][offset] == seq.token_ids[pos], f"{seq} reads bad KV"
            # The known tokens, then any drafts (speculative decoding) after them.
            known = seq.token_ids[start : start + s.num_new_tokens - len(s.draft_token_ids)]
            for pos, token in enumerate(known + s.draft_token_ids, start):
                block, offset = self.slot(seq, pos)
                self.kv[block][offset] = token

    def check_output(self, out: SchedulerOutput) -> None:
        scheduler = self.scheduler
        ids = [s.seq.seq_id for s in out.scheduled]
        assert len(ids) == len(set(ids)) <= scheduler.max_num_seqs
        assert 0 < out.num_batched_tokens <= scheduler.max_num_batched_tokens or out.is_empty
        assert all(s.seq.status is SequenceStatus.RUNNING for s in out.scheduled)
        for s in out.scheduled:
            end = s.seq.num_computed_tokens + s.num_new_tokens
            assert len(s.seq.block_table) * self.bm.block_size >= end

    def check_state(self) -> None:
        scheduler = self.scheduler
        live = [*scheduler.waiting, *scheduler.running]
        assert len({seq.seq_id for seq in live}) == len(live), "a sequence is queued twice"
        unfinished = [seq for seq in self.seqs if not seq.is_finished]
        assert sorted(s.seq_id for s in live) == sorted(s.seq_id for s in unfinished)
        assert all(seq.status is SequenceStatus.WAITING for seq in scheduler.waiting)
        assert all(not seq.block_table for seq in scheduler.waiting)
        assert all(seq.status is SequenceStatus.RUNNING for seq in scheduler.running)
        if scheduler.by_priority:
            for queue in (list(scheduler.waiting), scheduler.running):
                keys = [(seq.priority, seq.arrival_time) for seq in queue]
                assert keys == sorted(keys), "a queue is out of (priority, arrival) order"
        self.bm.check_invariants(scheduler.running)
        assert scheduler.num_preemptions == sum(seq.num_preemptions for seq in self.seqs)


def chunk_sizes(out: SchedulerOutput, seq: Sequence) -> list[int]:
    return [s.num_new_tokens for s in out.scheduled if s.seq is seq]


def test_chunked_prefill_splits_a_long_prompt_by_the_budget() -> None:
    engine = FakeEngine(max_num_batched_tokens=16)
    seq = engine.add(list(range(100)), max_tokens=2)
    outs = [engine.step() for _ in range(7)]
    assert [chunk_sizes(out, seq) for out in outs] == [[16]] * 6 + [[4]]
    assert [out.scheduled[0].produces_token for out in outs] == [False] * 6 + [True]
    assert seq.num_output_tokens == 1 and seq.num_computed_tokens == 100
    assert chunk_sizes(engine.step(), seq) == [1]
    assert seq.status is SequenceStatus.FINISHED_LENGTH and engine.bm.num_free_blocks == 64


def test_chunked_prefill_is_mixed_with_running_decodes() -> None:
    engine = FakeEngine(max_num_batched_tokens=16)
    decoding = engine.add([1, 2, 3, 4], max_tokens=50)
    engine.step()
    long = engine.add(list(range(100, 200)), max_tokens=1)
    outs = [engine.step() for _ in range(7)]
    for out in outs:  # the running decode goes first, the prompt takes what is left
        assert out.scheduled[0].seq is decoding and out.scheduled[0].num_new_tokens == 1
    assert [chunk_sizes(out, long) for out in outs] == [[15]] * 6 + [[10]]
    assert all(out.num_batched_tokens == 16 for out in outs[:6])
    assert long.status is SequenceStatus.FINISHED_LENGTH and decoding.num_output_tokens == 8


def test_without_chunking_prompts_are_scheduled_whole() -> None:
    engine = FakeEngine(max_num_batched_tokens=16, enable_chunked_prefill=False)
    a = engine.add(list(range(10)), max_tokens=4)
    b = engine.add(list(range(20, 30)), max_tokens=4)
    first = engine.step()
    assert [(s.seq, s.num_new_tokens) for s in first.scheduled] == [(a, 10)]  # b waits whole
    second = engine.step()
    assert [(s.seq, s.num_new_tokens) for s in second.scheduled] == [(a, 1), (b, 10)]
    with pytest.raises(ValueError, match="max_num_batched_tokens=16"):
        engine.add(list(range(17)), max_tokens=1)


def test_max_num_seqs_caps_the_batch() -> None:
    engine = FakeEngine(max_num_seqs=2)
    seqs = [engine.add([i, i + 1], max_tokens=3) for i in range(0, 30, 10)]
    out = engine.step()
    assert [s.seq for s in out.scheduled] == seqs[:2] and engine.scheduler.num_waiting == 1
    engine.run_to_completion()
    assert all(seq.num_output_tokens == 3 for seq in seqs)


def test_preemption_takes_the_newest_and_everything_finishes() -> None:
    # Each sequence grows to 12 tokens = 3 blocks; 3 running need 9 of the 6 blocks.
    engine = FakeEngine(num_blocks=6, block_size=4, max_num_seqs=3)
    seqs = [engine.add([10 * i + j for j in range(4)], max_tokens=8) for i in range(4)]
    while not engine.scheduler.num_preemptions:
        out = engine.step()
    assert out.preempted == [seqs[2]] and seqs[2].status is SequenceStatus.WAITING
    assert seqs[2] not in [s.seq for s in out.scheduled]  # no re-admission in the same step
    assert list(engine.scheduler.waiting) == [seqs[2], seqs[3]]  # back in front of seqs[3]
    assert seqs[2].num_output_tokens > 0  # kept, and re-prefilled as part of its prefix
    engine.run_to_completion()
    for seq in seqs:
        outputs = seq.output_token_ids
        assert len(outputs) == 8 and outputs == sorted(outputs)
        assert all(t % 1000 == seq.seq_id for t in outputs)
    assert engine.bm.num_free_blocks == 6


def test_prefix_hits_reduce_the_tokens_to_compute() -> None:
    engine = FakeEngine(block_size=4, max_num_batched_tokens=64)
    prompt = list(range(20))
    engine.add(prompt, max_tokens=1)
    engine.run_to_completion()
    longer = engine.add(prompt + [7, 8, 9], max_tokens=1)
    same = engine.add(prompt, max_tokens=1)
    out = engine.step()
    assert chunk_sizes(out, longer) == [3] and longer.num_cached_tokens == 20
    assert chunk_sizes(out, same) == [4] and same.num_cached_tokens == 16  # last block redone
    engine.run_to_completion()
    assert engine.bm.prefix_cache_hits == 36


def test_abort_mid_prefill_frees_everything() -> None:
    engine = FakeEngine(max_num_batched_tokens=16)
    long = engine.add(list(range(100)), max_tokens=5)
    waiting = engine.add(list(range(200, 300)), max_tokens=5)
    engine.step()
    engine.step()
    assert long.num_computed_tokens == 32 and engine.bm.num_free_blocks < 64
    assert engine.scheduler.abort_seq(long.request_id)
    assert engine.scheduler.abort_seq(waiting.seq_id)
    assert not engine.scheduler.abort_seq("no-such-request")
    assert long.status is waiting.status is SequenceStatus.FINISHED_ABORTED
    assert not engine.scheduler.has_unfinished_seqs() and engine.bm.num_free_blocks == 64
    engine.bm.check_invariants([])
    assert engine.scheduler.schedule().is_empty


def test_sequence_larger_than_the_cache_raises() -> None:
    engine = FakeEngine(num_blocks=2, block_size=4)
    engine.add(list(range(9)), max_tokens=1)
    with pytest.raises(RuntimeError, match="needing 3 KV blocks, but the cache holds only 2"):
        engine.step()


def fork(engine: FakeEngine, parent: Sequence) -> Sequence:
    child = Sequence(
        len(engine.seqs),
        parent.token_ids,
        parent.block_size,
        parent.sampling_params,
        arrival_time=parent.arrival_time,
        priority=parent.priority,
    )
    engine.seqs.append(child)
    engine.scheduler.fork_seq(parent, child)
    return child


def test_forked_sequences_copy_the_shared_block_on_write() -> None:
    engine = FakeEngine(block_size=4)
    parent = engine.add(list(range(6)), max_tokens=5)
    engine.step()
    child = fork(engine, parent)
    out = engine.step()  # both write slot 7, in the shared second block
    assert out.blocks_to_copy == [(child.block_table[1], parent.block_table[1])]
    engine.run_to_completion()
    assert parent.output_token_ids != child.output_token_ids
    assert engine.bm.num_free_blocks == 64


def first_scheduled_order(engine: FakeEngine) -> list[Sequence]:
    """Run to completion; the sequences in the order they were first scheduled."""
    order: list[Sequence] = []
    while engine.scheduler.has_unfinished_seqs():
        order += [s.seq for s in engine.step().scheduled if s.seq not in order]
    return order


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_priority_admits_a_later_urgent_request_first(policy: str) -> None:
    """vLLM v1's priority policy: waiting requests by (priority, arrival), lower first;
    fcfs keeps arrival order."""
    engine = FakeEngine(max_num_seqs=1, policy=policy)
    first = engine.add([1, 2, 3], max_tokens=2, priority=1)
    engine.step()  # first runs: the batch is full
    early = engine.add([4, 5, 6], max_tokens=2, priority=1)
    urgent = engine.add([7, 8, 9], max_tokens=2, priority=0)
    expected = [urgent, early] if policy == "priority" else [early, urgent]
    assert first_scheduled_order(engine) == [first, *expected]


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_preemption_evicts_the_lowest_priority_then_the_latest(policy: str) -> None:
    """vLLM v1: under "priority" the running sequence of largest (priority, arrival) is
    preempted and goes back to its place in the waiting queue; under "fcfs" the newest,
    back to the front. Each sequence grows to 3 blocks; 3 running need 9 of the 6."""
    engine = FakeEngine(num_blocks=6, block_size=4, max_num_seqs=3, policy=policy)
    seqs = [engine.add([10 * i + j for j in range(4)], 8, p) for i, p in enumerate([1, 1, 0])]
    engine.step()
    waiting = engine.add([90, 91, 92, 93], max_tokens=8, priority=0)  # the batch is full
    while not engine.scheduler.num_preemptions:
        out = engine.step()
    if policy == "priority":
        assert out.preempted == [seqs[1]]  # priority 1 as seqs[0], but later
        assert list(engine.scheduler.waiting) == [waiting, seqs[1]]
    else:
        assert out.preempted == [seqs[2]]
        assert list(engine.scheduler.waiting) == [seqs[2], waiting]
    engine.run_to_completion()
    assert all(seq.num_output_tokens == 8 for seq in engine.seqs)


@pytest.mark.parametrize(
    "seed, chunked, policy",
    [(0, True, "fcfs"), (1, False, "fcfs"), (2, True, "fcfs"), (3, True, "priority")],
)
def test_random_traffic_keeps_every_invariant(seed: int, chunked: bool, policy: str) -> None:
    rng = random.Random(seed)
    engine = FakeEngine(
        num_blocks=16,
        max_num_seqs=6,
        max_num_batched_tokens=32,
        enable_chunked_prefill=chunked,
        policy=policy,
    )
    prefixes = [[rng.randrange(50) for _ in range(8)] for _ in range(3)]
    for _ in range(200):
        if rng.random() < 0.4:
            prompt = rng.choice(prefixes)[: rng.randint(0, 8)]
            prompt += [rng.randrange(50) for _ in range(rng.randint(1, 12))]
            priority = rng.randint(-2, 2) if policy == "priority" else 0
            engine.add(prompt, max_tokens=rng.randint(1, 12), priority=priority)
        live = [*engine.scheduler.waiting, *engine.scheduler.running]
        if live and rng.random() < 0.05:
            assert engine.scheduler.abort_seq(rng.choice(live).seq_id)
        running = engine.scheduler.running
        if running and rng.random() < 0.05:
            fork(engine, rng.choice(running))
        out = engine.step()
        assert not out.is_empty or not engine.scheduler.has_unfinished_seqs()
    engine.run_to_completion()
    for seq in engine.seqs:
        assert seq.is_finished and not seq.block_table
        if seq.status is SequenceStatus.FINISHED_LENGTH:
            assert seq.num_output_tokens == seq.sampling_params
    assert engine.bm.num_free_blocks == 16
    engine.bm.check_invariants([])
    assert engine.scheduler.num_preemptions > 0 and engine.bm.prefix_cache_hits > 0


def finish_batch(scheduler: Scheduler, out: SchedulerOutput) -> None:
    """What the engine does when a batch's results come back (one token per sampled seq)."""
    scheduler.update_after_step(out.scheduled)
    for s in out.scheduled:
        if s.produces_token:
            s.seq.append_token(7)


def test_micro_batches_in_flight_hold_disjoint_sequences() -> None:
    """Pipeline parallelism (2 micro-batches): a second schedule() before the first batch's
    update takes only the other sequences, half of them each; an update frees its own."""
    bm = BlockManager(64, 4)
    scheduler = Scheduler(SchedulerConfig(8, 64), bm, num_micro_batches=2)
    seqs = [Sequence(i, [1, 2, 3], 4, sampling_params=4) for i in range(6)]
    for seq in seqs:
        scheduler.add_seq(seq)
    a = scheduler.schedule()
    b = scheduler.schedule()
    ids = lambda out: {s.seq.seq_id for s in out.scheduled}  # noqa: E731
    assert ids(a) == {0, 1, 2} and ids(b) == {3, 4, 5}
    assert scheduler.schedule().is_empty  # everything is in flight
    finish_batch(scheduler, a)
    c = scheduler.schedule()
    assert ids(c) == {0, 1, 2} and scheduler.in_flight == {0, 1, 2, 3, 4, 5}
    finish_batch(scheduler, b)
    finish_batch(scheduler, c)
    assert not scheduler.in_flight


def test_a_sequence_in_flight_is_never_preempted() -> None:
    """Blocks run out while the newest running sequence is in flight: the older one, not in
    flight, gives way (preempts itself) instead of the newest, as it otherwise would."""
    bm = BlockManager(4, 2)
    scheduler = Scheduler(SchedulerConfig(8, 64), bm, num_micro_batches=2)
    old, new = Sequence(0, [1, 2, 3, 4], 2, sampling_params=9), Sequence(1, [5, 6, 7], 2, 9)
    scheduler.add_seq(old)
    scheduler.add_seq(new)
    a = scheduler.schedule()  # old: 2 blocks
    b = scheduler.schedule()  # new: the other 2
    assert [s.seq for s in a.scheduled] == [old] and [s.seq for s in b.scheduled] == [new]
    finish_batch(scheduler, a)  # old has 5 tokens: its next one needs a 3rd block
    c = scheduler.schedule()
    assert c.preempted == [old] and not c.scheduled
    assert new.status is SequenceStatus.RUNNING and old.status is SequenceStatus.WAITING


def test_finished_req_ids_name_a_request_once_its_last_sequence_ends() -> None:
    """vLLM's finished_req_ids: a request of two sequences (a fork shares its request id)
    ends with the later one; an abort ends its request; an output that schedules nothing
    is not run, so it leaves them for the next."""
    engine = FakeEngine()
    parent = engine.add(list(range(6)), max_tokens=3)
    other = engine.add(list(range(10, 16)), max_tokens=8)
    assert engine.step().finished_req_ids == set()
    child = Sequence(99, parent.token_ids, 4, sampling_params=1, request_id=parent.request_id)
    engine.seqs.append(child)
    engine.scheduler.fork_seq(parent, child)
    engine.step()  # the child's one token: it ends, its parent goes on
    assert child.is_finished and not parent.is_finished
    assert engine.step().finished_req_ids == set()  # the parent's last token
    assert engine.step().finished_req_ids == {parent.request_id}
    engine.scheduler.abort_seq(other.request_id)
    assert engine.scheduler.schedule().finished_req_ids == set()  # empty: not run
    engine.add(list(range(20, 23)), max_tokens=1)
    assert engine.step().finished_req_ids == {other.request_id}


def _sampled(seq: Sequence, index: int) -> int:
    """The fake model's output token `index` of seq: a function of both, so that a token is
    known before the step that samples it is processed."""
    return 1000 * (index + 1) + seq.seq_id


def _token_at(seq: Sequence, pos: int) -> int:
    return (
        seq.token_ids[pos] if pos < seq.num_tokens else _sampled(seq, pos - seq.num_prompt_tokens)
    )


@pytest.mark.parametrize("seed", range(4))
def test_async_schedules_read_the_kv_of_the_step_in_flight(seed: int) -> None:
    """Async scheduling against the fake KV cache: the next step is scheduled before the
    last is processed, and sequences in flight run ahead, on placeholders or with their
    next prefill chunk; as the engine does, a step that samples for a sequence that may
    not (one in three here, for its first 3 tokens) is processed before the next is
    scheduled. Every chunk finds its tokens' KV (the step in flight's included), no
    sequence in flight is preempted (the checks of check_state), and every sequence gets
    its max_tokens tokens."""
    rng = random.Random(seed)
    engine = FakeEngine(num_blocks=14, block_size=4, max_num_seqs=6, max_num_batched_tokens=16)
    scheduler = engine.scheduler
    scheduler.async_scheduling = True
    queue: list[SchedulerOutput] = []

    def must_wait(seq: Sequence) -> bool:  # as min_tokens does, for its first tokens
        return seq.seq_id % 3 == 0 and seq.num_output_tokens < 3

    def waits(out: SchedulerOutput) -> bool:
        return any(s.produces_token and must_wait(s.seq) for s in out.scheduled)

    ran_ahead = 0

    def run(out: SchedulerOutput) -> None:
        for s in out.scheduled:
            seq = s.seq
            assert not (s.reads_placeholder and must_wait(seq))
            for pos in range(s.start):
                block, offset = engine.slot(seq, pos)
                assert engine.kv[block][offset] == _token_at(seq, pos), f"{seq} reads bad KV"
            for pos in range(s.start, s.start + s.num_new_tokens):
                block, offset = engine.slot(seq, pos)
                engine.kv[block][offset] = _token_at(seq, pos)

    def process(out: SchedulerOutput) -> None:
        scheduler.update_after_step(out.scheduled)
        for s in out.scheduled:
            if s.produces_token and not s.seq.is_finished:
                s.seq.append_token(_sampled(s.seq, s.seq.num_output_tokens))
                if s.seq.num_output_tokens >= s.seq.sampling_params:
                    scheduler.finish_seq(s.seq, SequenceStatus.FINISHED_LENGTH)

    for _ in range(12):
        engine.add([rng.randrange(100) for _ in range(rng.randint(1, 20))], rng.randint(1, 12))
    for _ in range(2000):
        if not scheduler.has_unfinished_seqs():
            break
        if queue and waits(queue[-1]):
            process(queue.pop(0))
        out = scheduler.schedule()
        for s in out.scheduled:  # blocks for the chunk, the copies done before it runs
            assert len(s.seq.block_table) * engine.bm.block_size >= s.start + s.num_new_tokens
        ran_ahead += sum(s.reads_placeholder for s in out.scheduled)
        for src, dst in out.blocks_to_copy:
            engine.kv[dst] = list(engine.kv[src])
        run(out)
        if not out.is_empty:
            queue.append(out)
        if len(queue) == 2 or (queue and out.is_empty):
            process(queue.pop(0))
        engine.check_state()
    while queue:
        process(queue.pop(0))
    assert not scheduler.has_unfinished_seqs() and ran_ahead > 10
    assert scheduler.num_preemptions > 0
    assert engine.bm.num_free_blocks == engine.bm.num_blocks
    for seq in engine.seqs:
        assert seq.output_token_ids == [_sampled(seq, i) for i in range(seq.sampling_params)]
