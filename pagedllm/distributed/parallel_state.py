"""Tensor- and pipeline-parallel ranks, sizes and groups (vLLM's layout).

The world is tensor_parallel_size x pipeline_parallel_size ranks; global rank
`pp_rank * tp_size + tp_rank`. A tensor-parallel group is one pipeline stage's ranks; a
pipeline group is the ranks that hold the same tensor-parallel shard in every stage, in
stage order:

    tp=2, pp=2:   TP groups [0, 1] (stage 0), [2, 3] (stage 1);  PP groups [0, 2], [1, 3]

Without an initialised process group the process is rank 0 of 1 in both, so every layer
works unchanged in a single process. `override_tensor_parallel` and
`override_pipeline_parallel` let tools (inspect, tests) build one rank's shard on the meta
device without starting a process group.

Expert parallelism (vLLM's enable_expert_parallel) uses the tensor-parallel group as its
group: the EP rank and size are the TP rank and size while `set_expert_parallel(True)` is
in force (the model is built inside it), else 0 and 1.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist


@dataclass(eq=False)
class GroupCoordinator:
    """One group this rank belongs to: its global ranks in group order, and the process
    groups that carry its tensors (device_group: NCCL on CUDA) and its pickled messages
    (cpu_group: gloo). Both are None for a group built without torch.distributed, and
    after destroy_distributed_environment."""

    ranks: tuple[int, ...]
    rank_in_group: int
    device_group: dist.ProcessGroup | None = None
    cpu_group: dist.ProcessGroup | None = None

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    @property
    def first_rank(self) -> int:
        return self.ranks[0]

    @property
    def last_rank(self) -> int:
        return self.ranks[-1]

    @property
    def is_first_rank(self) -> bool:
        return self.rank_in_group == 0

    @property
    def is_last_rank(self) -> bool:
        return self.rank_in_group == self.world_size - 1

    @property
    def next_rank(self) -> int:
        """The global rank after this one (the next pipeline stage)."""
        return self.ranks[(self.rank_in_group + 1) % self.world_size]

    @property
    def prev_rank(self) -> int:
        return self.ranks[(self.rank_in_group - 1) % self.world_size]


_ALONE = GroupCoordinator((0,), 0)
_tp_override: GroupCoordinator | None = None
_pp_override: GroupCoordinator | None = None
_tp_group: GroupCoordinator | None = None
_pp_group: GroupCoordinator | None = None


def get_tp_group() -> GroupCoordinator:
    return _tp_override or _tp_group or _ALONE


def get_pp_group() -> GroupCoordinator:
    return _pp_override or _pp_group or _ALONE


def get_tensor_model_parallel_world_size() -> int:
    return get_tp_group().world_size


def get_tensor_model_parallel_rank() -> int:
    return get_tp_group().rank_in_group


def get_pipeline_model_parallel_world_size() -> int:
    return get_pp_group().world_size


def get_pipeline_model_parallel_rank() -> int:
    return get_pp_group().rank_in_group


def _placeholder_group(rank: int, world_size: int) -> GroupCoordinator:
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside [0, {world_size})")
    return GroupCoordinator(tuple(range(world_size)), rank)


@contextmanager
def override_tensor_parallel(rank: int, world_size: int) -> Iterator[None]:
    """Build layers as rank `rank` of `world_size` without a process group."""
    global _tp_override
    previous, _tp_override = _tp_override, _placeholder_group(rank, world_size)
    try:
        yield
    finally:
        _tp_override = previous


@contextmanager
def override_pipeline_parallel(rank: int, world_size: int) -> Iterator[None]:
    """Build a model as pipeline stage `rank` of `world_size` without a process group."""
    global _pp_override
    previous, _pp_override = _pp_override, _placeholder_group(rank, world_size)
    try:
        yield
    finally:
        _pp_override = previous


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
    pipeline_parallel_size: int = 1,
) -> None:
    """Join the world and its tensor- and pipeline-parallel groups (world_size / pp ranks a
    stage).

    Control messages (the scheduled batch) go through gloo groups, so they never touch
    the accelerator even when tensors use NCCL.
    """
    global _cpu_group, _tp_group, _pp_group
    if world_size % pipeline_parallel_size:
        raise ValueError(
            f"world size {world_size} is not a multiple of pipeline_parallel_size "
            f"{pipeline_parallel_size}"
        )
    dist.init_process_group(
        backend,
        init_method=init_method,
        world_size=world_size,
        rank=rank,
        timeout=timedelta(seconds=timeout_s),
    )
    _cpu_group = dist.new_group(backend="gloo") if backend != "gloo" else dist.group.WORLD
    tp, pp = world_size // pipeline_parallel_size, pipeline_parallel_size
    if pp == 1:  # the tensor-parallel group is the world: no second communicator
        _tp_group = GroupCoordinator(tuple(range(world_size)), rank, dist.group.WORLD, _cpu_group)
    else:
        _tp_group = _new_groups([[s * tp + t for t in range(tp)] for s in range(pp)], rank, backend)
    _pp_group = _new_groups([[s * tp + t for s in range(pp)] for t in range(tp)], rank, backend)


def _new_groups(layout: list[list[int]], rank: int, backend: str) -> GroupCoordinator:
    """Create every group of `layout` (each rank must create all of them, in the same order)
    and return the one holding `rank`."""
    mine = None
    for ranks in layout:
        device_group = dist.new_group(ranks, backend=backend)
        cpu_group = dist.new_group(ranks, backend="gloo") if backend != "gloo" else device_group
        if rank in ranks:
            mine = GroupCoordinator(tuple(ranks), ranks.index(rank), device_group, cpu_group)
    assert mine is not None, f"rank {rank} is in no group of {layout}"
    return mine


def get_cpu_group() -> dist.ProcessGroup:
    assert _cpu_group is not None, "init_distributed_environment() was not called"
    return _cpu_group


def destroy_distributed_environment() -> None:
    """Leave the world, and drop the groups' process groups here, while the interpreter
    runs: the last handle's release joins a gloo group's worker threads (without the GIL).
    A worker frees a finished collective's tensors after the caller's wait has returned,
    and freeing a tensor made in Python takes the GIL; left to interpreter exit, that
    aborts the process (std::terminate) once in a while."""
    global _cpu_group, _tp_group, _pp_group
    if dist.is_initialized():
        dist.destroy_process_group()
    for group in (_tp_group, _pp_group):
        if group is not None:  # layers and links share these coordinators
            group.device_group = group.cpu_group = None
    _cpu_group = _tp_group = _pp_group = None
