"""Scheduler under max_loras (core/scheduler.py): the running sequences use at most max_loras
LoRA adapters; a waiting sequence whose adapter would exceed it is skipped and keeps its
place, those behind it are tried (vLLM v1's policy); base-model sequences never count.
Reference: tests/core/test_scheduler.py's fake engine and its invariants, plus the
adapters of the running sequences counted after every step."""

import random

import pytest

from pagedllm.core.sequence import Sequence
from pagedllm.lora.registry import LoadedAdapter
from pagedllm.lora.request import LoRARequest
from tests.core.test_scheduler import FakeEngine


def loaded(name: str, lora_int_id: int, key: str) -> LoadedAdapter:
    return LoadedAdapter(LoRARequest(name, lora_int_id, f"/adapters/{name}"), key, {})


A, B, C = (loaded(name, i, f"key-{name}") for i, name in enumerate("abc", 1))


class LoRAEngine(FakeEngine):
    def __init__(self, max_loras: int, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.scheduler.max_loras = max_loras

    def add(
        self,
        prompt: list[int],
        max_tokens: int,
        lora: LoadedAdapter | None = None,
        priority: int = 0,
    ) -> Sequence:
        seq_id = len(self.seqs)
        seq = Sequence(
            seq_id,
            prompt,
            self.bm.block_size,
            max_tokens,
            None,
            seq_id,
            priority,
            lora=lora,
        )
        self.seqs.append(seq)
        self.scheduler.add_seq(seq)
        return seq

    def running_loras(self) -> set[str]:
        return {seq.lora_key for seq in self.scheduler.running if seq.lora}

    def step_checked(self) -> list[Sequence]:
        """A step; the sequences it scheduled."""
        out = self.step()
        assert len(self.running_loras()) <= self.scheduler.max_loras
        return [s.seq for s in out.scheduled]


def test_a_second_adapter_waits_while_the_first_runs() -> None:
    engine = LoRAEngine(max_loras=1)
    a1, b1, a2, base = (engine.add([i, i + 1], 3, lora) for i, lora in enumerate([A, B, A, None]))
    assert engine.step_checked() == [a1, a2, base]
    assert list(engine.scheduler.waiting) == [b1]
    while not a1.is_finished or not a2.is_finished:
        assert b1 not in engine.step_checked()
    assert b1 in engine.step_checked()
    engine.run_to_completion()
    assert all(seq.num_output_tokens == 3 for seq in engine.seqs)


def test_skipped_sequences_keep_their_place_in_order() -> None:
    engine = LoRAEngine(max_loras=1, max_num_seqs=3)
    a1 = engine.add([1, 2], 4, A)
    b1, b2 = engine.add([3, 4], 2, B), engine.add([5, 6], 2, B)
    a2, a3 = engine.add([7, 8], 2, A), engine.add([9, 10], 2, A)
    assert engine.step_checked() == [a1, a2, a3]  # max_num_seqs, past the skipped b's
    late = engine.add([11, 12], 2, None)
    assert list(engine.scheduler.waiting) == [b1, b2, late]
    while a1 in engine.scheduler.running:
        engine.step_checked()
    assert engine.step_checked() == [b1, b2]  # first in line once a is done
    engine.run_to_completion()


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_base_model_sequences_are_not_bounded_by_max_loras(policy: str) -> None:
    engine = LoRAEngine(max_loras=1, max_num_seqs=8, policy=policy)
    seqs = [engine.add([i, i + 1], 2, [A, B, None][i % 3]) for i in range(9)]
    scheduled = engine.step_checked()
    assert scheduled == [seq for seq in seqs if seq.lora is not B][:8]
    assert all(seq.lora is B for seq in engine.scheduler.waiting)


def test_max_loras_2_runs_two_adapters_together() -> None:
    engine = LoRAEngine(max_loras=2)
    a, b, c, a2 = (engine.add([i, i + 1], 2, lora) for i, lora in enumerate([A, B, C, A]))
    assert engine.step_checked() == [a, b, a2]
    assert engine.running_loras() == {"key-a", "key-b"}
    engine.run_to_completion()
    assert c.num_output_tokens == 2


def test_adapters_of_the_same_weights_are_one_adapter() -> None:
    """A sequence's adapter is known by its content key: another adapter object (another
    name, id or folder) of the same weights is no second adapter; other weights are."""
    engine = LoRAEngine(max_loras=1)
    first = engine.add([1, 2], 2, A)
    same = engine.add([3, 4], 2, loaded("copy-of-a", 7, "key-a"))
    other = engine.add([5, 6], 2, loaded("a", 1, "key-a-changed"))
    assert engine.step_checked() == [first, same]
    assert list(engine.scheduler.waiting) == [other]


@pytest.mark.parametrize("seed, policy", [(0, "fcfs"), (1, "priority"), (2, "fcfs")])
def test_random_traffic_never_runs_more_than_max_loras(seed: int, policy: str) -> None:
    """With preemption (few blocks), aborts and every mix of adapters; all finish."""
    rng = random.Random(seed)
    engine = LoRAEngine(
        max_loras=2, num_blocks=10, max_num_seqs=6, max_num_batched_tokens=32, policy=policy
    )
    for _ in range(200):
        if rng.random() < 0.4:
            prompt = [rng.randrange(50) for _ in range(rng.randint(1, 14))]
            priority = rng.randint(-2, 2) if policy == "priority" else 0
            engine.add(prompt, rng.randint(1, 16), rng.choice([A, B, C, None]), priority)
        live = [*engine.scheduler.waiting, *engine.scheduler.running]
        if live and rng.random() < 0.05:
            engine.scheduler.abort_seq(rng.choice(live).seq_id)
        engine.step_checked()
    while engine.scheduler.has_unfinished_seqs():
        engine.step_checked()
    assert all(seq.is_finished for seq in engine.seqs)
    assert engine.scheduler.num_preemptions > 0
