"""Private anonymous memory maps for long-lived CPU tensors, and the OS's transparent huge
pages (THP): which size they have and whether a map may ask for them."""

import contextlib
import mmap
from pathlib import Path

import torch

THP_SYSFS = Path("/sys/kernel/mm/transparent_hugepage")


def huge_page_size() -> int | None:
    """Bytes of a transparent huge page where a map can ask for them with MADV_HUGEPAGE
    (THP in "madvise" or "always" mode), else None (mode "never", no THP, not Linux)."""
    try:
        mode = (THP_SYSFS / "enabled").read_text()
        size = int((THP_SYSFS / "hpage_pmd_size").read_text())
    except (OSError, ValueError):
        return None
    if "[never]" in mode or not hasattr(mmap, "MADV_HUGEPAGE"):
        return None
    return size


def anonymous_map(nbytes: int, huge_pages: bool) -> torch.Tensor:
    """A private anonymous map of nbytes zero bytes, as a uint8 tensor (which keeps the map
    alive). The OS maps its pages on first write, with 2 MiB pages or 4 KiB ones as
    huge_pages asks (a request, heard where the kernel has THP)."""
    region = mmap.mmap(-1, max(nbytes, 1), mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    option = getattr(mmap, "MADV_HUGEPAGE" if huge_pages else "MADV_NOHUGEPAGE", None)
    if option is not None:
        with contextlib.suppress(OSError):  # EINVAL: a kernel built without huge pages
            region.madvise(option)
    return torch.frombuffer(region, dtype=torch.uint8)[:nbytes]


def huge_page_map(nbytes: int, page: int) -> torch.Tensor:
    """nbytes of an anonymous map that asks for huge pages of `page` bytes (huge_page_size()),
    starting on a page boundary (the map is a page larger, so that its first page of nbytes
    is whole), as a uint8 tensor."""
    memory = anonymous_map(nbytes + page, huge_pages=True)
    start = -memory.data_ptr() % page
    return memory[start : start + nbytes]
