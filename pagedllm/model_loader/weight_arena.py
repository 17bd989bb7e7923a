"""A CPU model's weights moved into one map of transparent huge pages.

Every decode step streams all the weights from memory, and torch allocates each in 4 KiB
pages: a 135M-parameter bf16 model is ~66,000 pages, more than the TLB holds, so the stream
walks page tables as it goes. The same matrices in 2 MiB pages stream 6-17% faster in
skinny_gemm_bf16, and batch-1 decode takes ~5% less time a token (`pagedllm bench latency
--batch-size 1` re-measures it). The cost is at start-up: the OS zeroes each huge page on
first write, which can take 1-10 ms a page. So the copy stops once it has taken
HUGE_PAGE_BUDGET_S, and the weights not yet copied stay in their 4 KiB pages.

Only parameters move. Buffers are caches that models may share: get_rope hands every model
with the same rope settings one RotaryEmbedding, as in vLLM, so its cos/sin table moved into
one model's map would keep that whole map alive after the model is gone, and the next model
would copy the old map into its own.
"""

import time
from collections import deque
from dataclasses import dataclass, field

import torch
from torch import nn

from pagedllm.cpu_memory import huge_page_map, huge_page_size

HUGE_PAGE_BUDGET_S = 0.4
ALIGNMENT = 64  # bytes: a cache line, and oneDNN's and the AMX kernels' alignment


@dataclass(frozen=True)
class ArenaStats:
    moved_bytes: int  # of the map: the leading storages, copied before the budget ran out
    total_bytes: int  # of the map: all the CPU storages behind the parameters
    seconds: float


@dataclass
class _Slot:
    """One storage's bytes and the parameters that view them."""

    storage: torch.UntypedStorage
    offset: int = 0
    views: list[nn.Parameter] = field(default_factory=list)


def _slots(model: nn.Module) -> list[_Slot]:
    """The CPU storages behind the model's parameters, each once, with the parameters that
    view them (a parameter two modules hold, as a tied LM head, once)."""
    slots: dict[int, _Slot] = {}
    for param in model.parameters():
        if param.device.type == "cpu" and param.layout == torch.strided:
            storage = param.untyped_storage()
            slots.setdefault(storage.data_ptr(), _Slot(storage)).views.append(param)
    return [slot for slot in slots.values() if slot.storage.nbytes() > 0]


def move_weights_to_arena(
    model: nn.Module, budget_s: float = HUGE_PAGE_BUDGET_S
) -> tuple[torch.Tensor, ArenaStats] | None:
    """Copy the model's CPU parameters, storage by storage, into one 2 MiB-aligned map that
    asks for huge pages, and point each at its copy (same shapes, strides, values and
    sharing), until the copy has taken budget_s: the storages left keep their 4 KiB pages
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
    arena, moved = huge_page_map(total, page), 0
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
    for param in slot.views:
        elements = dest.view(param.dtype)
        offset = elements.storage_offset() + param.storage_offset()
        param.data = elements.as_strided(param.shape, param.stride(), offset)
