"""A CPU model's weights moved into one map of transparent huge pages.

Every decode step streams all the weights from memory, and torch allocates each in 4 KiB
pages: a 135M-parameter bf16 model is ~66,000 pages, more than the TLB holds, so the stream
walks page tables as it goes. The same matrices in 2 MiB pages streamed 6-17% faster in
skinny_gemm_bf16, and batch-1 decode took ~5% less time a token on the Zen 4 development VM
(BENCHMARKS.md, sessions 15-16). The cost is at start-up: the OS zeroes each huge page on first
write, 1-5 ms per page there and up to ~10 ms on the AMX VM. So the copy stops once it has
taken HUGE_PAGE_BUDGET_S, and the weights not yet copied stay in their 4 KiB pages. To take
those faults off the start-up's path, ArenaPrefault maps the arena before the checkpoint
loads (sized by the parameters as built) and faults its pages in on a background thread
meanwhile; the copy then writes into pages the OS has already given.

Only parameters move. Buffers are caches that models may share: get_rope hands every model
with the same rope settings one RotaryEmbedding, as in vLLM, so its cos/sin table moved into
one model's map would keep that whole map alive after the model is gone, and the next model
would copy the old map into its own.
"""

import threading
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


class ArenaPrefault:
    """A map of nbytes (plus a page, for alignment) that asks for huge pages, whose pages a
    background thread faults in, a few at a time, until take() stops it."""

    def __init__(self, nbytes: int, page: int) -> None:
        self.memory = anonymous_map(nbytes + page, huge_pages=True)
        self._stop = threading.Event()
        first_page = -self.memory.data_ptr() % page
        self._thread = threading.Thread(
            target=self._fault, args=(self.memory[first_page::page],), daemon=True
        )
        self._thread.start()

    def _fault(self, page_bytes: torch.Tensor) -> None:
        """Writes a byte of each page (torch releases the GIL inside zero_)."""
        for i in range(0, len(page_bytes), 8):
            if self._stop.is_set():
                return
            page_bytes[i : i + 8].zero_()

    def take(self) -> torch.Tensor:
        """Stops the thread (the pages not faulted yet fault on first write) -> the map."""
        self._stop.set()
        self._thread.join()
        return self.memory


def prefault_arena(model: nn.Module) -> ArenaPrefault | None:
    """An ArenaPrefault the size of the model's CPU parameters as built, or None where the
    OS has no transparent huge pages to ask for (or nothing to move)."""
    page = huge_page_size()
    total = _plan(_slots(model))
    return None if page is None or total == 0 else ArenaPrefault(total, page)


def _plan(slots: list[_Slot]) -> int:
    """Sets each slot's offset in the arena -> the arena's bytes."""
    total = 0
    for slot in slots:
        slot.offset = total
        total += -(-slot.storage.nbytes() // ALIGNMENT) * ALIGNMENT
    return total


def move_weights_to_arena(
    model: nn.Module, budget_s: float = HUGE_PAGE_BUDGET_S, prefault: ArenaPrefault | None = None
) -> tuple[torch.Tensor, ArenaStats] | None:
    """Copy the model's CPU parameters, storage by storage, into one 2 MiB-aligned map that
    asks for huge pages, and point each at its copy (same shapes, strides, values and
    sharing), until the copy has taken budget_s: the storages left keep their 4 KiB pages
    (moving them into 4 KiB pages of the map gained nothing). The map is prefault's where
    given and large enough, else a new one. Returns the map and what was moved, or None
    where the OS has no transparent huge pages to ask for."""
    page = huge_page_size()
    slots = _slots(model)
    if page is None or not slots:
        return None
    total = _plan(slots)
    memory = prefault.take() if prefault is not None else None
    if memory is None or memory.numel() < total + page:
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
    for param in slot.views:
        elements = dest.view(param.dtype)
        offset = elements.storage_offset() + param.storage_offset()
        param.data = elements.as_strided(param.shape, param.stride(), offset)
