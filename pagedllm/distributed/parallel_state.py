"""Tensor-parallel rank and size, and whether MoE layers place whole experts on the ranks.

Without an initialised process group the process is rank 0 of 1, so every layer works
unchanged in a single process. `override_tensor_parallel` lets tools (inspect, tests)
build one rank's shard on the meta device without starting a process group.

Expert parallelism (vLLM's enable_expert_parallel) uses the tensor-parallel group as its
group: the EP rank and size are the TP rank and size while `set_expert_parallel(True)` is
in force (the model is built inside it), else 0 and 1.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import torch.distributed as dist

_override: tuple[int, int] | None = None


def get_tensor_model_parallel_world_size() -> int:
    if _override is not None:
        return _override[1]
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def get_tensor_model_parallel_rank() -> int:
    if _override is not None:
        return _override[0]
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


@contextmanager
def override_tensor_parallel(rank: int, world_size: int) -> Iterator[None]:
    """Build layers as rank `rank` of `world_size` without a process group."""
    global _override
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside [0, {world_size})")
    previous, _override = _override, (rank, world_size)
    try:
        yield
    finally:
        _override = previous


_expert_parallel = False


def get_expert_parallel_world_size() -> int:
    """Ranks the MoE layers built now spread their experts over (1: every rank holds every
    expert, split along its intermediate dimension)."""
    return get_tensor_model_parallel_world_size() if _expert_parallel else 1


def get_expert_parallel_rank() -> int:
    return get_tensor_model_parallel_rank() if _expert_parallel else 0


@contextmanager
def set_expert_parallel(enabled: bool) -> Iterator[None]:
    """MoE layers built inside place whole experts on the tensor-parallel ranks (`enabled`)
    or split every expert (not)."""
    global _expert_parallel
    previous, _expert_parallel = _expert_parallel, enabled
    try:
        yield
    finally:
        _expert_parallel = previous


_cpu_group: dist.ProcessGroup | None = None


def init_distributed_environment(
    world_size: int,
    rank: int,
    init_method: str = "env://",
    backend: str = "gloo",
    timeout_s: float = 600.0,
) -> None:
    """Join the tensor-parallel process group (every rank of the world is one tp rank).

    Control messages (the scheduled batch) go through a gloo group, so they never touch
    the accelerator even when tensors use NCCL.
    """
    global _cpu_group
    dist.init_process_group(
        backend,
        init_method=init_method,
        world_size=world_size,
        rank=rank,
        timeout=timedelta(seconds=timeout_s),
    )
    _cpu_group = dist.new_group(backend="gloo") if backend != "gloo" else dist.group.WORLD


def get_cpu_group() -> dist.ProcessGroup:
    assert _cpu_group is not None, "init_distributed_environment() was not called"
    return _cpu_group


def destroy_distributed_environment() -> None:
    global _cpu_group
    if dist.is_initialized():
        dist.destroy_process_group()
    _cpu_group = None
