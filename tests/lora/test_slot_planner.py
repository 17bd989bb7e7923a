"""pagedllm/lora/slot_planner.py: which slot holds which adapter, decided by the engine.
Reference: least-recently-used order worked by hand, the weights sent only when a slot
takes an adapter, and a slot the step uses never taken."""

import pytest

from pagedllm.lora.registry import LoadedAdapter
from pagedllm.lora.request import LoRARequest
from pagedllm.lora.slot_planner import LoRASlotPlanner

A, B, C = (
    LoadedAdapter(LoRARequest(name, i, f"/{name}"), f"key-{name}", {name: ()})
    for i, name in enumerate("abc", 1)
)


def step(planner: LoRASlotPlanner, *adapters: LoadedAdapter) -> tuple[list, list[int]]:
    """Plans a step: (what each slot holds after it, the slots it loads)."""
    _, loads = planner.plan(list(adapters))
    return list(planner.slots), sorted(loads)


def test_slots_are_reused_least_recently_used_first() -> None:
    planner = LoRASlotPlanner(2)
    assert step(planner, A) == (["key-a", None], [0])
    assert step(planner, B) == (["key-a", "key-b"], [1])
    assert step(planner, A) == (["key-a", "key-b"], [])  # a is now the most recent
    assert step(planner, C) == (["key-a", "key-c"], [1])  # b's slot
    assert step(planner, B) == (["key-b", "key-c"], [0])  # a's slot


def test_a_slot_the_step_uses_is_never_taken() -> None:
    """a's slot is the least recent one when c needs a slot, but a runs in the same step."""
    planner = LoRASlotPlanner(2)
    step(planner, A)
    step(planner, B)
    assert step(planner, C, A) == (["key-a", "key-c"], [1])
    slot_of, loads = planner.plan([B, C, B])
    assert slot_of == {"key-b": 0, "key-c": 1} and list(loads) == [0]
    assert loads[0] is B.weights


def test_the_same_weights_share_a_slot_and_too_many_adapters_fail() -> None:
    planner = LoRASlotPlanner(1)
    copy = LoadedAdapter(LoRARequest("copy", 9, "/copy"), A.key, A.weights)
    assert planner.plan([A, copy]) == ({"key-a": 0}, {0: A.weights})
    with pytest.raises(RuntimeError, match="more than 1 LoRA adapters"):
        planner.plan([A, B])


def test_after_reset_every_slot_is_loaded_again() -> None:
    planner = LoRASlotPlanner(2)
    step(planner, A, B)
    planner.reset()
    assert step(planner, A) == (["key-a", None], [0])
    assert step(planner, B) == (["key-a", "key-b"], [1])
