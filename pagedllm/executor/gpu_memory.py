"""How much of a GPU the KV cache takes: vLLM's `gpu_memory_utilization` rule.

The engine may use `gpu_memory_utilization` of the GPU's total memory (vLLM's default 0.9):
its weights, the peak of a forward and sampling of the largest step, what it holds outside
torch's allocator (cuBLAS's workspace, NCCL's buffers, Triton's modules), and the KV cache,
which takes the rest. So at start-up the GPU must have that much free (other processes use
the remainder), and after the model loads a profiling step (ModelRunner.profile_run) of
`max_num_batched_tokens` tokens over up to `max_num_seqs` sequences, sampled with top-k,
top-p, penalties and logprobs, measures the peak. CUDA graphs, captured after the cache is
allocated, come out of the remaining `1 - gpu_memory_utilization`, as in vLLM.
"""

import gc
from collections.abc import Callable
from dataclasses import dataclass

import torch

GiB = 1024**3


@dataclass(frozen=True)
class MemorySnapshot:
    """The device's free and total bytes, and torch's allocated and reserved bytes."""

    free: int
    total: int
    allocated: int
    reserved: int

    @classmethod
    def take(cls, device: torch.device, release: bool = False) -> "MemorySnapshot":
        """release: first hand back what torch caches and dropped objects still hold
        (an engine closed before this one), as vLLM does before its first snapshot."""
        if release:
            gc.collect()
            torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(device)
        allocated = torch.cuda.memory_allocated(device)
        return cls(free, total, allocated, torch.cuda.memory_reserved(device))


def check_free_memory(start: MemorySnapshot, utilization: float) -> None:
    """Raises ValueError when the GPU has less free than the engine may use."""
    wanted = utilization * start.total
    if start.free < wanted:
        raise ValueError(
            f"the GPU has {start.free / GiB:.2f} GiB free of {start.total / GiB:.2f} GiB at "
            f"start-up, less than gpu_memory_utilization={utilization} of it "
            f"({wanted / GiB:.2f} GiB): lower gpu_memory_utilization "
            "(--gpu-memory-utilization) or free the GPU memory other processes hold"
        )


@dataclass(frozen=True)
class KVCacheBudget:
    """What the profile found (bytes): the KV cache's share, and what else the engine uses."""

    kv_cache: int
    weights: int
    peak_activations: int
    non_torch: int
    requested: int

    def describe(self) -> str:
        return (
            f"{self.kv_cache / GiB:.2f} GiB for the KV cache of {self.requested / GiB:.2f} "
            f"GiB (gpu_memory_utilization); weights {self.weights / GiB:.2f} GiB, peak "
            f"activations {self.peak_activations / GiB:.2f} GiB, outside torch "
            f"{self.non_torch / GiB:.2f} GiB"
        )


def kv_cache_budget(
    start: MemorySnapshot,
    loaded: MemorySnapshot,
    peak_allocated: int,
    after: MemorySnapshot,
    utilization: float,
) -> KVCacheBudget:
    """The KV cache's bytes: utilization x total, less the weights (allocated once loaded),
    the profile's peak above them, and the memory the process took outside torch's
    allocator since start-up; never more than is free after the profile.

    start: before the model loaded; loaded: after; peak_allocated: torch's peak allocated
    bytes during the profile, its temporary cache excluded; after: once the profile's
    memory is returned to the device."""
    weights = loaded.allocated - start.allocated
    peak = max(0, peak_allocated - loaded.allocated)
    taken = start.free - after.free
    non_torch = max(0, taken - (after.reserved - start.reserved))
    requested = int(utilization * start.total)
    kv_cache = min(requested - weights - peak - non_torch, after.free)
    return KVCacheBudget(kv_cache, weights, peak, non_torch, requested)


def profile_kv_cache_budget(
    device: torch.device,
    start: MemorySnapshot,
    loaded: MemorySnapshot,
    utilization: float,
    profile_run: Callable[[], int],
) -> KVCacheBudget:
    """kv_cache_budget from a profile run: `profile_run` runs the largest step and returns
    the bytes of the temporary KV cache it used, left out of the peak."""
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    cache_bytes = profile_run()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - cache_bytes
    after = MemorySnapshot.take(device, release=True)
    return kv_cache_budget(start, loaded, peak, after, utilization)
