"""Parameters that know how to load themselves from a full checkpoint tensor.

Each parameter carries `weight_loader(param, loaded_weight, shard_id=None)`; the loader
cuts this rank's shard from the checkpoint tensor, so every rank reads the same files.
"""

from collections.abc import Callable

import torch
from torch import nn

WeightLoader = Callable[..., None]


def new_parameter(
    shape: tuple[int, ...], weight_loader: WeightLoader, **attrs: int
) -> nn.Parameter:
    """An uninitialised parameter in the default dtype and device, with its loader attached."""
    param = nn.Parameter(torch.empty(shape), requires_grad=False)
    param.weight_loader = weight_loader
    return param


def check_shape(param: torch.Tensor, loaded_weight: torch.Tensor, what: str = "weight") -> None:
    if tuple(param.shape) != tuple(loaded_weight.shape):
        raise ValueError(
            f"{what} shape mismatch: checkpoint has {tuple(loaded_weight.shape)}, "
            f"the model expects {tuple(param.shape)}"
        )


def copy_weight(param: torch.Tensor, loaded_weight: torch.Tensor, what: str = "weight") -> None:
    """Copy with a shape check, casting to the parameter's dtype and device."""
    check_shape(param, loaded_weight, what)
    param.data.copy_(loaded_weight)


def default_weight_loader(
    param: torch.Tensor, loaded_weight: torch.Tensor, shard_id: object = None
) -> None:
    """Loader for replicated parameters: the whole tensor, shape-checked."""
    copy_weight(param, loaded_weight)


def shard_of(
    loaded_weight: torch.Tensor, dim: int, rank: int, size: int, num_shards: int
) -> torch.Tensor:
    """Shard `rank` of `num_shards` equal slices of `size` along `dim`; the checkpoint
    tensor must hold exactly num_shards * size there."""
    if loaded_weight.shape[dim] != num_shards * size:
        raise ValueError(
            f"checkpoint tensor of shape {tuple(loaded_weight.shape)} has "
            f"{loaded_weight.shape[dim]} along dim {dim}, the model expects "
            f"{num_shards} x {size} = {num_shards * size}"
        )
    return loaded_weight.narrow(dim, rank * size, size)
