"""A CPU model's weights moved into one map of transparent huge pages.

Every decode step streams all the weights from memory, and torch allocates each in 4 KiB
pages: a 135M-parameter bf16 model is ~66,000 pages, more than the TLB holds, so the stream
walks page tables as it goes. The same matrices in 2 MiB pages streamed 6-17% faster in
skinny_gemm_bf16, and batch-1 decode took ~5% less time a token on the Zen 4 development VM
(BENCHMARKS.md, sessions 15-16). The cost is at start-up: the OS zeroes each huge page on first
write, 1-5 ms per page there and up to ~10 ms on the AMX VM. So the copy stops once it has
taken HUGE_PAGE_BUDGET_S, and the weights not yet copied stay in their 4 KiB pages.
"""

import time
from collections import deque
from dataclasses import dataclass, field

import torch
from torch import nn

from pagedllm.cpu_memory import anonymous_map, huge_page_size

HUGE_PAGE_BUDGET_S = 0.4
ALIGNMENT = 64  # bytes: a cache line, and oneDNN's and the AMX kernels' alignment


@dataclass(frozen=True)
class ArenaStats:
    moved_bytes: int  # of the map: the leading storages, copied before the budget ran out
    total_bytes: int  # of the map: all the CPU storages behind parameters and buffers
    seconds: float


@dataclass
class _Slot:
    """One storage's bytes and the tensors (parameters, buffers) that view them."""

    storage: torch.UntypedStorage
    offset: int = 0
    views: list[tuple[nn.Module, str, str, torch.Tensor]] = field(default_factory=list)


def _slots(model: nn.Module) -> list[_Slot]:
    """The CPU storages behind the model's parameters and buffers, each once, with the
    module entries that hold them (a tensor two modules hold, as a tied LM head, twice:
    _move gives both entries one copy)."""
    slots: dict[int, _Slot] = {}
    for module in model.modules():
        for kind in ("_parameters", "_buffers"):
            for name, tensor in getattr(module, kind).items():
                if tensor is None or tensor.device.type != "cpu" or tensor.layout != torch.strided:
                    continue
                storage = tensor.untyped_storage()
                slot = slots.setdefault(storage.data_ptr(), _Slot(storage))
                slot.views.append((module, kind, name, tensor))
    return [slot for slot in slots.values() if slot.storage.nbytes() > 0]


def move_weights_to_arena(
    model: nn.Module, budget_s: float = HUGE_PAGE_BUDGET_S
) -> tuple[torch.Tensor, ArenaStats] | None:
    """Copy the model's CPU parameters and buffers, storage by storage, into one 2 MiB-aligned
    map that asks for huge pages, and point each at its copy (same shapes, strides, values
    and sharing), until the copy has taken budget_s: the storages left keep their 4 KiB pages
    (moving them into 4 KiB pages of the map gained nothing). Returns the map and what was
    moved, or None where the OS has no transparent huge pages to ask for."""
    page = huge_page_size()
    slots = _slots(model)
    if page is None or not slots:
        return None
    total = 0
    for slot in slots:
        slot.offset = total
        total += -(-slot.storage.nbytes() // ALIGNMENT) * ALIGNMENT
    memory = anonymous_map(total + page, huge_pages=True)
    start = -memory.data_ptr() % page
    arena, moved = memory[start : start + total], 0
    pending = deque(slots)  # a moved slot is dropped, and with it the old storage
    del slots
    began = time.perf_counter()
    while pending and time.perf_counter() - began <= budget_s:
        slot = pending.popleft()
        end = slot.offset + slot.storage.nbytes()
        _move(slot, arena[slot.offset : end])
        moved = -(-end // ALIGNMENT) * ALIGNMENT
    return arena, ArenaStats(moved, total, time.perf_counter() - began)


def _move(slot: _Slot, dest: torch.Tensor) -> None:
    dest.copy_(torch.empty(0, dtype=torch.uint8).set_(slot.storage))
    moved: dict[int, torch.Tensor] = {}  # a tensor two modules hold gets one copy
    for module, kind, name, tensor in slot.views:
        if id(tensor) not in moved:
            elements = dest.view(tensor.dtype)
            offset = elements.storage_offset() + tensor.storage_offset()
            moved[id(tensor)] = elements.as_strided(tensor.shape, tensor.stride(), offset)
        if kind == "_parameters":
            tensor.data = moved[id(tensor)]
        else:
            module._buffers[name] = moved[id(tensor)]
