"""Continuous batching with chunked prefill and preemption by recompute (as vLLM v1).

Each step first serves the running sequences in queue order (a decode takes 1 token,
a sequence still in prefill takes its next chunk), then admits waiting sequences in
queue order, all within `max_num_batched_tokens` tokens and `max_num_seqs` sequences.
When a running sequence cannot get the blocks it needs, the last running sequence in
queue order is preempted: its blocks are freed and it goes back to the waiting queue, to
be re-prefilled (prompt and outputs so far) when blocks allow.

The queue order is the policy's (SchedulerConfig.policy, vLLM's --scheduling-policy):
  "fcfs"      running in admission order, waiting in arrival order; a preempted
              sequence goes to the front of the waiting queue (the newest is preempted).
  "priority"  both queues in (priority, arrival time) order, lower first, equals in the
              order they joined; a preempted sequence goes back to its place, and the
              running sequence preempted is the one of largest (priority, arrival time),
              as in vLLM v1. A waiting sequence never preempts a running one.
Under either, the victim is the last running sequence not in flight, and the running
loop has not reached it yet (or it is the sequence short of blocks itself), so a step
never preempts a sequence it has already scheduled.

One step, as the engine drives it:
    out = scheduler.schedule()
    ...the runner copies out.blocks_to_copy, then computes each scheduled sequence's
    tokens [s.start, s.start + s.num_new_tokens)...
    scheduler.update_after_step(out.scheduled)
    ...for each s with s.produces_token: seq.append_token(t); on a stop,
    scheduler.finish_seq(seq, status)

Under pipeline parallelism the engine schedules the next batch before the last one's
results are back (up to one per stage): a sequence stays in flight from the schedule()
that took it to the update_after_step() of its batch, and no batch takes it meanwhile, so
the batches in flight hold disjoint sequences. Nor is a sequence in flight preempted. A
batch then takes at most 1 / num_micro_batches of the unfinished sequences (rounded up),
so the sequences spread over the micro-batches and every stage has one to work on.

Async scheduling (vLLM's; SchedulerConfig.async_scheduling): the engine schedules the
next step while the last one runs on the device, and a sequence of the step in flight is
scheduled again, before the token it is sampling there is known. Its next chunk starts at
`seq.num_scheduled_tokens`; when that is the token being sampled
(`seq.num_output_placeholders`), the step reads it from the step before's sampled ids on
the device (where sampling needs that token on the host, the engine samples the step only
once the step before is processed; engine/llm_engine.py). A sequence is in at most two
steps at once, since the engine processes a step before it schedules a third. A sequence
in flight is never preempted: one short of blocks waits for the next step.

Speculative decoding (engine/drafter.py): a decoding sequence may hold draft tokens
(`seq.spec_token_ids`), which its next schedule takes after its last token, as many as the
token budget and free blocks allow (a draft never preempts). The step computes them all;
`update_after_step` counts only the known token as computed, and `accept_draft_tokens`
the drafts the model agreed with, once the engine has appended them. The KV of rejected
drafts lies past `num_computed_tokens`, where the next steps overwrite it, and
`mark_computed` never registers a block before all its tokens are computed.
"""

import bisect
import time
from collections import Counter, deque
from dataclasses import dataclass, field

from pagedllm.config import SchedulerConfig
from pagedllm.core.block_manager import BlockManager
from pagedllm.core.sequence import Sequence, SequenceStatus


@dataclass
class ScheduledSequence:
    """seq computes tokens [start, start + num_new_tokens) this step; start is where the
    tokens computed or in flight ended when it was scheduled (seq.num_scheduled_tokens).

    produces_token: the chunk reaches seq's last token (or the last one a step in flight
    samples), so the model's logits at it are sampled and the engine appends a token.
    Fixed at scheduling time.
    """

    seq: Sequence
    num_new_tokens: int
    draft_token_ids: list[int] = field(default_factory=list)
    start: int = field(init=False)
    produces_token: bool = field(init=False)
    reads_placeholder: bool = field(init=False)
    """The chunk's last token is one the step in flight is still sampling (async)."""

    def __post_init__(self) -> None:
        seq = self.seq
        self.start = seq.num_scheduled_tokens
        end = self.start + self.num_new_tokens - len(self.draft_token_ids)  # of known tokens
        num_tokens = seq.num_tokens_with_placeholders
        assert end > self.start and end <= num_tokens
        assert not self.draft_token_ids or end == seq.num_tokens, "drafts follow the last token"
        self.produces_token = end == num_tokens
        self.reads_placeholder = end > seq.num_tokens


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSequence] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)  # (src, dst)
    # Requests whose last sequence ended (finished or aborted) since the last output that
    # scheduled anything: the executor drops what it keeps of them (vLLM's finished_req_ids).
    finished_req_ids: set[str] = field(default_factory=set)

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    """Owns the waiting and running queues; the engine owns finishing decisions.

    With enable_chunked_prefill off, a prompt is scheduled only whole, so the engine must
    keep max_model_len <= max_num_batched_tokens (a preempted sequence is re-prefilled
    whole, prompt and outputs).
    """

    def __init__(
        self,
        config: SchedulerConfig,
        block_manager: BlockManager,
        num_micro_batches: int = 1,
        max_loras: int | None = None,
    ) -> None:
        """`max_loras`: the most LoRA adapters the running sequences may use at once (None:
        LoRA off)."""
        self.max_num_seqs = config.max_num_seqs
        self.max_loras = max_loras
        self.num_micro_batches = num_micro_batches
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.enable_chunked_prefill = config.enable_chunked_prefill
        self.block_manager = block_manager
        # Whether a sequence in flight is scheduled again (else it waits for its update).
        self.async_scheduling = config.async_scheduling
        self.by_priority = config.policy == "priority"
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.in_flight: set[int] = set()  # seq_ids of scheduled batches not yet updated
        self.num_preemptions = 0
        self.num_unfinished: Counter[str] = Counter()  # unfinished sequences by request id
        self.finished_req_ids: set[str] = set()  # for the next output that schedules

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def has_unfinished_seqs(self) -> bool:
        return bool(self.waiting or self.running)

    def add_seq(self, seq: Sequence) -> None:
        assert seq.status is SequenceStatus.WAITING and not seq.block_table
        if not self.enable_chunked_prefill and seq.num_tokens > self.max_num_batched_tokens:
            raise ValueError(
                f"prompt of {seq.num_tokens} tokens exceeds max_num_batched_tokens="
                f"{self.max_num_batched_tokens}; enable chunked prefill or shorten the prompt"
            )
        self._add_waiting(seq)
        self.num_unfinished[seq.request_id] += 1

    def _add_waiting(self, seq: Sequence, preempted: bool = False) -> None:
        if self.by_priority:
            bisect.insort(self.waiting, seq, key=_queue_key)
        elif preempted:
            self.waiting.appendleft(seq)
        else:
            self.waiting.append(seq)

    def _add_running(self, seq: Sequence) -> None:
        if self.by_priority:
            bisect.insort(self.running, seq, key=_queue_key)
        else:
            self.running.append(seq)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        unfinished = len(self.running) + len(self.waiting)
        max_seqs = min(self.max_num_seqs, -(-unfinished // self.num_micro_batches))
        budget, short = self._schedule_running(out, max_seqs)
        if not (short or out.preempted):
            self._schedule_waiting(out, budget, max_seqs)
        for s in out.scheduled:
            s.seq.num_in_flight_tokens += s.num_new_tokens
            s.seq.num_output_placeholders += s.produces_token
        self.in_flight.update(s.seq.seq_id for s in out.scheduled)
        if out.scheduled:  # an empty output is not run: its news waits for the next
            out.finished_req_ids, self.finished_req_ids = self.finished_req_ids, set()
        return out

    def _schedule_running(self, out: SchedulerOutput, max_seqs: int) -> tuple[int, bool]:
        """Schedule running sequences in order; returns the token budget left and whether
        one was short of blocks (then no waiting sequence is admitted)."""
        budget = self.max_num_batched_tokens
        i = 0
        while i < len(self.running) and budget > 0 and len(out.scheduled) < max_seqs:
            seq = self.running[i]
            i += 1
            if seq.seq_id in self.in_flight and not self._runs_ahead(seq):
                continue
            num_new_tokens = min(
                seq.num_tokens_with_placeholders - seq.num_scheduled_tokens, budget
            )
            drafts = self._take_drafts(seq, num_new_tokens, budget)
            num_new_tokens += len(drafts)
            if not self._reserve_slots(seq, num_new_tokens, out):
                return budget, True
            out.scheduled.append(ScheduledSequence(seq, num_new_tokens, drafts))
            budget -= num_new_tokens
        return budget, False

    def _take_drafts(self, seq: Sequence, num_new_tokens: int, budget: int) -> list[int]:
        """seq's draft tokens (taken from it: a draft is verified once) that fit in the
        token budget after its num_new_tokens; none when their blocks are not free."""
        drafts, seq.spec_token_ids = seq.spec_token_ids[: budget - num_new_tokens], []
        num_tokens = seq.num_in_flight_tokens + num_new_tokens + len(drafts)
        if drafts and not self.block_manager.can_append(seq, num_tokens):
            return []
        return drafts

    def _runs_ahead(self, seq: Sequence) -> bool:
        """Whether a sequence in flight is scheduled again now: under async scheduling,
        when it has tokens left to schedule (known, or the one the step in flight samples)."""
        return self.async_scheduling and seq.num_scheduled_tokens < seq.num_tokens_with_placeholders

    def _reserve_slots(self, seq: Sequence, num_new_tokens: int, out: SchedulerOutput) -> bool:
        """Get blocks for seq's new tokens, preempting the last running sequences in queue
        order not in flight while they are short. False if seq is short: preempted, or in
        flight (then it preempts nothing, and waits)."""
        num_new_tokens += seq.num_in_flight_tokens  # the block manager counts from computed
        if self.block_manager.appends_in_place(seq, num_new_tokens):
            return True
        if seq.seq_id in self.in_flight and not self.block_manager.can_append(seq, num_new_tokens):
            return False
        while not self.block_manager.can_append(seq, num_new_tokens):
            candidates = [q for q in self.running if q.seq_id not in self.in_flight]
            victim = candidates[-1]  # seq itself, at least
            self.running.remove(victim)
            self._preempt(victim)
            out.preempted.append(victim)
            if victim is seq:
                return False
        out.blocks_to_copy += self.block_manager.append_slots(seq, num_new_tokens)
        return True

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.spec_token_ids = []  # re-prefilled first, then drafted again
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self._add_waiting(seq, preempted=True)

    def _schedule_waiting(self, out: SchedulerOutput, budget: int, max_seqs: int) -> None:
        """Admit waiting sequences in order while tokens, sequence slots and blocks allow. A
        sequence whose LoRA adapter would make the running ones use more than max_loras
        waits, and those behind it are tried (as vLLM v1 skips it)."""
        skipped: list[Sequence] = []
        loras = {seq.lora_key for seq in self.running} - {None}
        while (
            self.waiting
            and budget > 0
            and len(self.running) < self.max_num_seqs
            and len(out.scheduled) < max_seqs
        ):
            seq = self.waiting[0]
            if self._over_max_loras(seq, loras):
                skipped.append(self.waiting.popleft())
                continue
            num_new_tokens = seq.num_tokens - self.block_manager.num_prefix_hit_tokens(seq)
            if not self.enable_chunked_prefill and num_new_tokens > budget:
                break
            if not self.block_manager.can_allocate(seq):
                self._check_fits_in_cache(seq)
                break
            self.waiting.popleft()
            if seq.lora_key is not None:
                loras.add(seq.lora_key)
            self.block_manager.allocate(seq)
            seq.status = SequenceStatus.RUNNING
            if seq.first_scheduled_time is None:
                seq.first_scheduled_time = time.monotonic()
            self._add_running(seq)
            num_new_tokens = min(num_new_tokens, budget)
            out.scheduled.append(ScheduledSequence(seq, num_new_tokens))
            budget -= num_new_tokens
        self.waiting.extendleft(reversed(skipped))

    def _over_max_loras(self, seq: Sequence, loras: set[str]) -> bool:
        return (
            self.max_loras is not None
            and seq.lora_key is not None
            and seq.lora_key not in loras
            and len(loras) >= self.max_loras
        )

    def _check_fits_in_cache(self, seq: Sequence) -> None:
        if seq.num_blocks > self.block_manager.num_blocks:
            raise RuntimeError(
                f"sequence {seq.seq_id} has {seq.num_tokens} tokens, needing {seq.num_blocks} "
                f"KV blocks, but the cache holds only {self.block_manager.num_blocks}; "
                "max_model_len must fit in the KV cache"
            )

    def update_after_step(self, scheduled: list[ScheduledSequence]) -> None:
        """Record that the scheduled tokens' KV is now in the cache (sequences that ended
        while their batch was in flight are left as they are)."""
        for s in scheduled:
            seq = s.seq
            seq.num_in_flight_tokens -= s.num_new_tokens
            seq.num_output_placeholders -= s.produces_token
            if not seq.num_in_flight_tokens:
                self.in_flight.discard(seq.seq_id)
            if seq.status.is_finished:  # ended while in flight: its last step is discarded
                continue
            assert seq.status is SequenceStatus.RUNNING
            seq.num_computed_tokens += s.num_new_tokens - len(s.draft_token_ids)
            assert seq.num_computed_tokens <= seq.num_tokens
            self.block_manager.mark_computed(seq)

    def accept_draft_tokens(self, seq: Sequence, num_accepted: int) -> None:
        """After update_after_step and the engine's appends: the first `num_accepted`
        draft tokens of seq's last step are now its tokens, their KV computed then."""
        seq.num_computed_tokens += num_accepted
        assert seq.num_computed_tokens < seq.num_tokens, "the last token is never computed"
        self.block_manager.mark_computed(seq)

    def finish_seq(self, seq: Sequence, status: SequenceStatus) -> None:
        assert status.is_finished and seq.status is SequenceStatus.RUNNING
        self.running.remove(seq)
        seq.status = status
        self.block_manager.free(seq)
        self._ended(seq)

    def fork_seq(self, parent: Sequence, child: Sequence) -> None:
        """Run child (same tokens as the running parent) on the parent's shared blocks."""
        assert parent.status is SequenceStatus.RUNNING
        self.block_manager.fork(parent, child)
        child.status = SequenceStatus.RUNNING
        self._add_running(child)
        self.num_unfinished[child.request_id] += 1

    def abort_seq(self, seq_id_or_request_id: int | str) -> bool:
        """Abort every unfinished sequence with this seq_id (int) or request_id (str)."""
        key = seq_id_or_request_id
        matches = [
            seq
            for seq in (*self.waiting, *self.running)
            if (seq.seq_id if isinstance(key, int) else seq.request_id) == key
        ]
        for seq in matches:
            if seq.status is SequenceStatus.WAITING:
                self.waiting.remove(seq)
            else:
                self.running.remove(seq)
            seq.status = SequenceStatus.FINISHED_ABORTED
            self.block_manager.free(seq)
            self._ended(seq)
        return bool(matches)

    def _ended(self, seq: Sequence) -> None:
        """seq finished or was aborted: its request ends with its last sequence."""
        self.num_unfinished[seq.request_id] -= 1
        if not self.num_unfinished[seq.request_id]:
            del self.num_unfinished[seq.request_id]
            self.finished_req_ids.add(seq.request_id)


def _queue_key(seq: Sequence) -> tuple[int, float]:
    """The "priority" policy's order: lower priority first, then earlier arrival."""
    return seq.priority, seq.arrival_time
