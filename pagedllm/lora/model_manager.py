"""A rank's LoRA adapters: the slots on its model's layers, which adapter each slot holds,
and the adapters read from disk kept in host memory (max_cpu_loras, least recently used
dropped first). Every rank of a step assigns slots the same way, from the same steps.
"""

from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from pagedllm.config import LoRAConfig
from pagedllm.layers.linear import LinearBase
from pagedllm.lora.layers import LoRASlots, set_lora_mapping
from pagedllm.lora.peft_adapter import load_lora_weights, read_peft_adapter
from pagedllm.lora.request import LoRARequest

# The checkpoint modules an adapter may target (the model class's lora_target_shapes).
LORA_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

AdapterKey = tuple[int, str]  # (lora_int_id, lora_path)
Weights = dict[str, tuple[torch.Tensor, torch.Tensor]]


class LoRAModelManager:
    def __init__(
        self, model: nn.Module, config: LoRAConfig, dtype: torch.dtype, device: torch.device
    ) -> None:
        self.config = config
        self.device = device
        self.target_shapes = type(model).lora_target_shapes(model.config)
        # each targeted layer's slots, with the checkpoint modules fused in it, in order
        self.layers: list[tuple[LoRASlots, list[str]]] = []
        packed = type(model).packed_modules_mapping()
        for name, module in model.named_modules():
            parent, _, leaf = name.rpartition(".")
            subs = packed.get(leaf, [leaf])
            if not isinstance(module, LinearBase) or not set(subs) <= set(LORA_TARGET_MODULES):
                continue
            slots = LoRASlots(
                module, len(subs), config.max_loras, config.max_lora_rank, dtype, device
            )
            module.lora = slots
            self.layers.append((slots, [f"{parent}.{sub}" for sub in subs]))
        self.slots: list[AdapterKey | None] = [None] * config.max_loras
        self.recent: list[int] = list(range(config.max_loras))  # slots, least recent first
        self.cpu_cache: OrderedDict[AdapterKey, Weights] = OrderedDict()

    @contextmanager
    def activate(
        self, requests: dict[int, LoRARequest], lora_ids: list[int], lengths: list[int]
    ) -> Iterator[None]:
        """The step's forward with each chunk's adapter (`lora_ids`, 0: none) applied to its
        `lengths` rows; `requests`: the step's adapters by id (at most max_loras)."""
        slot_of = {i: self._slot(requests[i], set(requests)) for i in requests}
        rows: list[int] = []
        for lora_id, length in zip(lora_ids, lengths, strict=True):
            rows.extend([slot_of[lora_id] if lora_id else -1] * length)
        used = sorted(set(rows) - {-1})
        if not used:
            slots = []
        elif len(set(rows)) == 1:  # every row runs with one adapter: no mask to apply
            slots = [(used[0], None)]
        else:
            mapping = torch.tensor(rows, dtype=torch.int64).to(self.device, non_blocking=True)
            slots = [(slot, (mapping == slot).unsqueeze(1)) for slot in used]
        with set_lora_mapping(slots):
            yield

    def _slot(self, request: LoRARequest, step_ids: set[int]) -> int:
        """The slot holding the request's adapter, loading it into the least recently used
        slot no adapter of this step holds."""
        key = (request.lora_int_id, request.lora_path)
        if key in self.slots:
            slot = self.slots.index(key)
        else:
            free = [
                s for s in self.recent if self.slots[s] is None or self.slots[s][0] not in step_ids
            ]
            if not free:  # the scheduler keeps a step's adapters within max_loras
                raise RuntimeError(f"a step names more than max_loras adapters: {sorted(step_ids)}")
            slot = free[0]
            self._load(slot, key)
        self.recent.remove(slot)
        self.recent.append(slot)
        return slot

    def _load(self, slot: int, key: AdapterKey) -> None:
        weights = self._weights(key)
        self.slots[slot] = None
        for slots, modules in self.layers:
            slots.set_slot(slot, [weights.get(name) for name in modules])
        self.slots[slot] = key

    def _weights(self, key: AdapterKey) -> Weights:
        if key in self.cpu_cache:
            self.cpu_cache.move_to_end(key)
            return self.cpu_cache[key]
        adapter = read_peft_adapter(key[1], self.target_shapes, self.config.max_lora_rank)
        weights = load_lora_weights(adapter)
        self.cpu_cache[key] = weights
        while len(self.cpu_cache) > self.config.max_cpu_loras:
            self.cpu_cache.popitem(last=False)
        return weights
