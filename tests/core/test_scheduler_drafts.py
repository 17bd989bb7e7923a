"""Scheduler under speculative decoding (core/scheduler.py): draft tokens taken after a
sequence's last token within the budget and free blocks, computed by the step, counted
only once accepted. Reference: tests/core/test_scheduler.py's fake paged KV cache, which
stores each slot's token id (drafts after the known tokens) and checks that every
scheduled sequence reads its own tokens [0, num_computed_tokens): the KV of a rejected
draft counted as computed, or registered in the prefix cache, reads as a wrong token."""

import random

import pytest

from pagedllm.core.scheduler import SchedulerOutput
from pagedllm.core.sequence import Sequence, SequenceStatus
from pagedllm.spec_decode.rejection_sampler import accepted_tokens
from tests.core.test_scheduler import FakeEngine


def target(seq: Sequence, pos: int) -> int:
    """The fake model's token at position pos of seq (its prompt decides it)."""
    return (seq.prompt_token_ids[0] * 31 + pos * 7) % 13


class DraftingEngine(FakeEngine):
    """FakeEngine whose decoding sequences draft: each draft token the fake model's own
    with probability `right`, else a wrong one."""

    def __init__(self, rng: random.Random, right: float = 0.6, k: int = 3, **kwargs) -> None:
        super().__init__(**kwargs)
        self.rng, self.right, self.k = rng, right, k
        self.num_accepted = 0

    def step(self) -> SchedulerOutput:
        out = self.scheduler.schedule()
        self.check_output(out)
        self.run_model(out)
        self.scheduler.update_after_step(out.scheduled)
        for s in out.scheduled:
            if s.produces_token:
                self.append(s.seq, s.draft_token_ids)
        self.num_steps += 1
        self.check_state()
        return out

    def append(self, seq: Sequence, drafts: list[int]) -> None:
        """What the output processor does: the accepted tokens one by one up to the
        length limit, then the accepted drafts counted; then the next drafts."""
        sampled = [target(seq, seq.num_tokens + j) for j in range(len(drafts) + 1)]
        accepted = accepted_tokens(sampled, drafts)
        for token in accepted:
            seq.append_token(token)
            if seq.num_output_tokens >= seq.sampling_params:
                self.scheduler.finish_seq(seq, SequenceStatus.FINISHED_LENGTH)
                return
        self.scheduler.accept_draft_tokens(seq, len(accepted) - 1)
        self.num_accepted += len(accepted) - 1
        room = seq.sampling_params - seq.num_output_tokens - 1
        seq.spec_token_ids = [self.draft(seq, seq.num_tokens + j) for j in range(min(self.k, room))]

    def draft(self, seq: Sequence, pos: int) -> int:
        right = target(seq, pos)
        return right if self.rng.random() < self.right else right + 13


def test_drafts_follow_the_last_token_and_count_once_accepted() -> None:
    engine = DraftingEngine(random.Random(0), max_num_batched_tokens=64)
    seq = engine.add([1, 2, 3, 4, 5], max_tokens=20)
    engine.step()  # the prompt
    assert seq.num_computed_tokens == 5 and seq.num_tokens == 6
    seq.spec_token_ids = [target(seq, 6), target(seq, 7), 99]
    out = engine.step()
    assert out.scheduled[0].num_new_tokens == 4 and out.scheduled[0].draft_token_ids[2] == 99
    # Two drafts accepted, the third replaced by the model's token.
    assert seq.output_token_ids[1:] == [target(seq, 6), target(seq, 7), target(seq, 8)]
    assert seq.num_computed_tokens == seq.num_tokens - 1 == 8


def test_drafts_are_cut_to_the_token_budget() -> None:
    engine = DraftingEngine(random.Random(0), max_num_batched_tokens=8)
    a, b = engine.add([1] * 5, max_tokens=20), engine.add([2] * 5, max_tokens=20)
    engine.step()  # a's prompt and 3 tokens of b's
    a.spec_token_ids = [7, 7, 7, 7, 7, 7, 7, 7, 7, 7]
    out = engine.step()
    assert [s.num_new_tokens for s in out.scheduled] == [8]  # b's prompt waits
    assert len(out.scheduled[0].draft_token_ids) == 7
    assert b.num_computed_tokens == 3


def test_drafts_without_free_blocks_are_dropped_not_preempting() -> None:
    engine = DraftingEngine(random.Random(0), num_blocks=4, block_size=4)
    a = engine.add([1] * 5, max_tokens=20)
    engine.add([2] * 7, max_tokens=20)
    engine.step()
    assert engine.bm.num_free_blocks == 0
    a.spec_token_ids = [5, 5, 5]  # the last would need a third block
    out = engine.step()
    assert [s.num_new_tokens for s in out.scheduled] == [1, 1]
    assert not out.preempted and not out.scheduled[0].draft_token_ids


def test_preemption_drops_the_drafts() -> None:
    engine = DraftingEngine(random.Random(0))
    seq = engine.add([1, 2, 3], max_tokens=20)
    engine.step()
    seq.spec_token_ids = [4, 5]
    engine.scheduler.running.remove(seq)
    engine.scheduler._preempt(seq)
    assert seq.spec_token_ids == []


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_traffic_with_drafts_reads_only_right_kv(seed: int) -> None:
    """Preemption, chunked prefill, prefix hits on blocks that held rejected drafts, forks
    and aborts, as test_random_traffic_keeps_every_invariant, with drafts each step."""
    rng = random.Random(seed)
    engine = DraftingEngine(rng, num_blocks=12, max_num_seqs=6, max_num_batched_tokens=24)
    prefixes = [[rng.randrange(50) for _ in range(8)] for _ in range(3)]
    for _ in range(200):
        if rng.random() < 0.4:
            prompt = rng.choice(prefixes)[: rng.randint(0, 8)]
            prompt += [rng.randrange(50) for _ in range(rng.randint(1, 12))]
            engine.add(prompt, max_tokens=rng.randint(1, 16))
        live = [*engine.scheduler.waiting, *engine.scheduler.running]
        if live and rng.random() < 0.05:
            assert engine.scheduler.abort_seq(rng.choice(live).seq_id)
        engine.step()
    engine.run_to_completion()
    for seq in engine.seqs:
        assert seq.is_finished and not seq.block_table
        if seq.status is SequenceStatus.FINISHED_LENGTH:
            assert seq.num_output_tokens == seq.sampling_params
            start = seq.num_prompt_tokens
            expected = [target(seq, start + j) for j in range(seq.num_output_tokens)]
            assert seq.output_token_ids == expected
    assert engine.bm.num_free_blocks == 12
    assert engine.scheduler.num_preemptions > 0 and engine.bm.prefix_cache_hits > 0
    assert engine.num_accepted > 50
