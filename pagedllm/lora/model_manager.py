"""A rank's LoRA slots: every targeted linear layer of its model holds max_loras of them
(lora/layers.py). Which adapter a slot holds is the engine's decision (slot_planner.py): a
step names the slots its rows use, by adapter key, and carries the weights of those to load
first, so a rank reads no folder and holds no other copy of an adapter.
"""

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from pagedllm.config import LoRAConfig
from pagedllm.layers.linear import LinearBase
from pagedllm.lora.layers import LoRAMapping, LoRASlots, set_lora_mapping
from pagedllm.lora.registry import Weights


class LoRAModelManager:
    def __init__(
        self, model: nn.Module, config: LoRAConfig, dtype: torch.dtype, device: torch.device
    ) -> None:
        self.device = device
        # each targeted layer's slots, with the checkpoint modules fused in it, in order
        self.layers: list[tuple[LoRASlots, list[str]]] = []
        targets = type(model).lora_target_shapes(model.config)
        packed = type(model).packed_modules_mapping()
        for name, module in model.named_modules():
            parent, _, leaf = name.rpartition(".")
            modules = [f"{parent}.{sub}" for sub in packed.get(leaf, [leaf])]
            if not isinstance(module, LinearBase) or not all(m in targets for m in modules):
                continue
            try:
                slots = LoRASlots(
                    module, len(modules), config.max_loras, config.max_lora_rank, dtype, device
                )
            except (RuntimeError, MemoryError) as e:  # torch's out-of-memory errors
                raise ValueError(
                    f"LoRA slots of {name} (max_loras {config.max_loras} x max_lora_rank "
                    f"{config.max_lora_rank}) do not fit in memory: lower --max-loras or "
                    f"--max-lora-rank ({str(e).splitlines()[0]})"
                ) from None
            module.lora = slots
            self.layers.append((slots, modules))
        self.slot_keys: list[str | None] = [None] * config.max_loras

    @contextmanager
    def activate(
        self,
        slot_keys: dict[int, str],
        loads: dict[int, Weights],
        chunk_slots: list[int],
        lengths: list[int],
    ) -> Iterator[None]:
        """The step's forward with each chunk's slot (`chunk_slots`, -1: none) applied to
        its `lengths` rows, after loading `loads` (slot -> weights); `slot_keys`: the key
        each slot the step uses must hold."""
        for slot, weights in loads.items():
            self._load(slot, slot_keys[slot], weights)
        for slot, key in slot_keys.items():
            if self.slot_keys[slot] != key:
                raise RuntimeError(f"LoRA slot {slot} holds {self.slot_keys[slot]}, not {key}")
        rows: list[int] = []
        for slot, length in zip(chunk_slots, lengths, strict=True):
            rows.extend([slot] * length)
        used = tuple(sorted(set(rows) - {-1}))
        mapping = None
        if used:
            row_slots = torch.tensor(rows, dtype=torch.int32).to(self.device, non_blocking=True)
            mapping = LoRAMapping(row_slots, used)
        with set_lora_mapping(mapping):
            yield

    @property
    def num_slots(self) -> int:
        return len(self.slot_keys)

    def _load(self, slot: int, key: str, weights: Weights) -> None:
        self.slot_keys[slot] = None
        for slots, modules in self.layers:
            slots.set_slot(slot, [weights.get(name) for name in modules])
        self.slot_keys[slot] = key
