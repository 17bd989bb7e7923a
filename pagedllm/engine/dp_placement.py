"""Where a node's data-parallel replicas run: each on its own GPUs, or its own CPU cores.

On CUDA, replica i of a node's L sees GPUs i*W .. (i+1)*W-1 of the node's visible ones,
W its ranks (TP x PP) (CUDA_VISIBLE_DEVICES, set for its process before it starts, as vLLM
sets it per DP rank), so its ranks are its cuda:0..W-1. On CPU, replica i is pinned to the i-th
1/L of the cores this process may use, and takes that many torch threads; its
tensor-parallel workers inherit the pinning and split it again (executor/worker.py's
rank_device). Without enough GPUs or cores for a share each, replicas share them.
"""

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from pagedllm.engine.arg_utils import EngineArgs
from pagedllm.logger import init_logger

logger = init_logger(__name__)


def local_ranks(engine_args: EngineArgs) -> range:
    """The replica ranks this node runs; ValueError if they don't fit data_parallel_size."""
    size, start = engine_args.data_parallel_size, engine_args.data_parallel_start_rank
    local = engine_args.data_parallel_size_local
    local = size - start if local is None else local
    if local < 1 or start < 0 or start + local > size:
        raise ValueError(
            f"data-parallel ranks {start}..{start + local - 1} (--data-parallel-start-rank, "
            f"--data-parallel-size-local) must lie in 0..{size - 1} (--data-parallel-size)"
        )
    return range(start, start + local)


def visible_gpus() -> list[str]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [gpu for gpu in visible.split(",") if gpu.strip()]
    return [str(i) for i in range(torch.cuda.device_count())]


def gpu_share(gpus: list[str], index: int, num_local: int, world_size: int) -> list[str] | None:
    """Replica `index`'s GPUs, or None when the node has too few for a share each."""
    if len(gpus) < num_local * world_size:
        return None
    return gpus[index * world_size : (index + 1) * world_size]


def cpu_share(cores: list[int], index: int, num_local: int) -> list[int] | None:
    """Replica `index`'s cores, or None when there are fewer cores than replicas."""
    per_replica = len(cores) // num_local
    if per_replica < 1:
        return None
    return cores[index * per_replica : (index + 1) * per_replica]


@contextmanager
def replica_environment(device: str, index: int, num_local: int, world_size: int) -> Iterator[None]:
    """Around starting replica `index`'s process: its CUDA_VISIBLE_DEVICES on a plain
    "cuda" device (an explicit cuda:N, or too few GPUs, leaves the GPUs shared)."""
    share = None
    if device == "cuda":
        share = gpu_share(visible_gpus(), index, num_local, world_size)
        if share is None and index == 0:
            logger.warning(
                "fewer GPUs than data-parallel replicas x TP x PP: replicas share them, so "
                "give each a share of their memory (gpu_memory_utilization, summing to at "
                "most 1)"
            )
    if share is None:
        yield
        return
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(share)
    try:
        yield
    finally:
        if before is None:
            del os.environ["CUDA_VISIBLE_DEVICES"]
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before


def pin_cpu_share(index: int, num_local: int) -> None:
    """In replica `index`'s process: pin it to its share of the cores and take as many
    torch threads (unless the user set OMP_NUM_THREADS)."""
    share = cpu_share(sorted(os.sched_getaffinity(0)), index, num_local)
    if share is None:
        torch.set_num_threads(1)
        return
    os.sched_setaffinity(0, share)
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(len(share))
