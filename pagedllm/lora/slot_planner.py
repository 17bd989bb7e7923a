"""Which adapter each of the max_loras slots holds on every rank, decided once, by the
engine, as it plans each step: an adapter a step needs and no slot holds goes to the least
recently used slot no adapter of the step holds, and the step carries its weights (the only
time they travel to the ranks, which read no folder). Slots are known by the adapters'
content keys (registry.LoadedAdapter.key)."""

from pagedllm.lora.registry import LoadedAdapter, Weights


class LoRASlotPlanner:
    def __init__(self, max_loras: int) -> None:
        self.slots: list[str | None] = [None] * max_loras
        self.recent: list[int] = list(range(max_loras))  # least recently used first

    def plan(self, adapters: list[LoadedAdapter]) -> tuple[dict[str, int], dict[int, Weights]]:
        """(each adapter's slot by key, the weights each slot must load first) for a step
        whose rows use `adapters` (at most max_loras keys: the scheduler's bound)."""
        step_keys = {adapter.key for adapter in adapters}
        slot_of: dict[str, int] = {}
        loads: dict[int, Weights] = {}
        for adapter in adapters:
            if adapter.key in slot_of:
                continue
            if adapter.key in self.slots:
                slot = self.slots.index(adapter.key)
            else:
                slot = self._free_slot(step_keys)
                self.slots[slot] = adapter.key
                loads[slot] = adapter.weights
            self.recent.remove(slot)
            self.recent.append(slot)
            slot_of[adapter.key] = slot
        return slot_of, loads

    def _free_slot(self, step_keys: set[str]) -> int:
        for slot in self.recent:
            if self.slots[slot] not in step_keys:
                return slot
        raise RuntimeError(f"a step uses more than {len(self.slots)} LoRA adapters (max_loras)")

    def reset(self) -> None:
        """After a failed step, whose loads the ranks may not have made: every slot is
        loaded again when next used."""
        self.slots = [None] * len(self.slots)
