"""Tensor-parallel rank and size.

Without an initialised process group the process is rank 0 of 1, so every layer works
unchanged in a single process. `override_tensor_parallel` lets tools (inspect, tests)
build one rank's shard on the meta device without starting a process group.
"""

from collections.abc import Iterator
from contextlib import contextmanager

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
