"""Memory planning for recorded kernel launches: the buffers a capture allocated, packed into
one arena where buffers whose launches never overlap in time share bytes.

During capture every buffer stays alive, so each has memory of its own; a 30-layer decode
step then holds 30 layers of activations although at most a few are live at once (as
torch's allocator would have reused them). A buffer is live from the first launch that
points into it to the last (the step's output to the end); buffers are placed in order of
first use at the lowest arena offset free of every buffer live at the same time, and each
launch argument pointing into a buffer is moved to the buffer's new place.

Only the arguments a launch's kernel declares as pointers (`Launch.pointers`) are looked up
among the buffers; its sizes, strides, flags and floats are never moved, whatever their value.
"""

import bisect
from collections.abc import Iterable

import torch

from pagedllm._cpu_kernels import Launch

_ALIGN = 64


class Buffer:
    """A capture's allocation: its address range and, once planned, its arena offset."""

    def __init__(self, start: int, nbytes: int) -> None:
        self.start, self.nbytes = start, nbytes
        self.first = self.last = -1  # launch indices using it
        self.offset = -1


def _find(buffers: list[Buffer], starts: list[int], value: int) -> Buffer | None:
    """The buffer whose address range holds the pointer value, if any."""
    i = bisect.bisect_right(starts, value) - 1
    if i >= 0 and value < buffers[i].start + buffers[i].nbytes:
        return buffers[i]
    return None


def _pointers(launch: Launch) -> list[int]:
    return [launch.args[i] for i in launch.pointers]


def _place(live: list[Buffer], buffer: Buffer) -> int:
    """The lowest aligned offset where buffer overlaps none of `live` in the arena."""
    offset = 0
    for other in sorted(live, key=lambda b: b.offset):
        if offset + buffer.nbytes <= other.offset:
            break
        offset = max(offset, -(-(other.offset + other.nbytes) // _ALIGN) * _ALIGN)
    return offset


def storages(tensors: Iterable[torch.Tensor]) -> dict[int, int]:
    """Start address -> bytes of each distinct memory the tensors hold."""
    return {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}


def plan(
    launches: list[Launch], allocations: Iterable[torch.Tensor], output: torch.Tensor
) -> tuple[list[Launch], torch.Tensor, torch.Tensor]:
    """-> (the launches pointing into the arena, the arena [bytes] uint8, output in it).

    allocations: the tensors capture allocated (output among them), all still alive."""
    buffers = [Buffer(start, n) for start, n in sorted(storages(allocations).items()) if n > 0]
    starts = [b.start for b in buffers]
    for i, launch in enumerate(launches):
        for arg in _pointers(launch):
            buffer = _find(buffers, starts, arg)
            if buffer is not None:
                buffer.first = i if buffer.first < 0 else buffer.first
                buffer.last = i
    out_buffer = _find(buffers, starts, output.untyped_storage().data_ptr())
    if out_buffer is not None:  # else the output is memory capture did not allocate
        out_buffer.first = max(out_buffer.first, 0)
        out_buffer.last = len(launches)
    used = sorted((b for b in buffers if b.first >= 0), key=lambda b: b.first)
    placed: list[Buffer] = []
    for buffer in used:
        live = [b for b in placed if b.last >= buffer.first]
        buffer.offset = _place(live, buffer)
        placed.append(buffer)
    size = max((b.offset + b.nbytes for b in placed), default=0)
    arena = torch.empty(size, dtype=torch.uint8)
    base = arena.data_ptr()

    def moved(launch: Launch) -> Launch:
        args = list(launch.args)
        for i in launch.pointers:
            buffer = _find(buffers, starts, args[i])
            if buffer is not None:
                args[i] = base + buffer.offset + (args[i] - buffer.start)
        return launch._replace(args=tuple(args))

    planned = [moved(launch) for launch in launches]
    if out_buffer is None:
        return planned, arena, output
    offset = out_buffer.offset + output.data_ptr() - out_buffer.start
    moved_output = torch.empty(0, dtype=output.dtype).set_(
        arena.untyped_storage(), offset // output.element_size(), output.shape, output.stride()
    )
    return planned, arena, moved_output
