"""Collectives over the tensor-parallel group (one pipeline stage's ranks); identity when tp
size is 1."""

import torch
import torch.distributed as dist

from pagedllm.distributed.parallel_state import get_tensor_model_parallel_world_size, get_tp_group


def tensor_model_parallel_all_reduce(x: torch.Tensor) -> torch.Tensor:
    if get_tensor_model_parallel_world_size() == 1:
        return x
    dist.all_reduce(x, group=get_tp_group().device_group)
    return x


def tensor_model_parallel_all_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Concatenate every rank's `x` along `dim`, in rank order."""
    world_size = get_tensor_model_parallel_world_size()
    if world_size == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(world_size)]
    dist.all_gather(parts, x.contiguous(), group=get_tp_group().device_group)
    return torch.cat(parts, dim=dim)


def tensor_model_parallel_broadcast(x: torch.Tensor) -> torch.Tensor:
    """The group's first rank's `x`, in place on every rank (contiguous, of one shape on
    all); on NCCL queued on the device without the host waiting."""
    group = get_tp_group()
    if group.world_size == 1:
        return x
    dist.broadcast(x, src=group.first_rank, group=group.device_group)
    return x
