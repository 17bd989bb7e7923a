"""glibc's allocator told to keep the memory a CPU step frees, for the next step.

A forward allocates and frees the same activations every step. By default glibc serves
allocations above an adaptive threshold (128 KiB to 32 MiB) with fresh maps and gives
freed memory at the top of its heap back to the OS once it passes twice that threshold,
so a step that frees a few large activations together faults their pages in again next
time: ~1M page faults and ~1.5 s of kernel time in the 256-request throughput job
(`pagedllm bench throughput`). With these settings allocations up to 32 MiB (glibc's
largest threshold) come from the heap, and up to TRIM_THRESHOLD of free heap stays with the
process, as tcmalloc and jemalloc (which vLLM's CPU backend has users preload) keep what
they are given back.
"""

import ctypes
import platform

M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 256 << 20


def keep_freed_memory() -> bool:
    """Set the process's thresholds (idempotent); False where the C library is not glibc."""
    if platform.libc_ver()[0] != "glibc":
        return False
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
