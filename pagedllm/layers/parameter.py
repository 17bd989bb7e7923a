"""Parameters that know how to load themselves from a full checkpoint tensor.

Each parameter carries `weight_loader(param, loaded_weight, shard_id=None)`; the loader
cuts this rank's shard from the checkpoint tensor, so every rank reads the same files.
"""

from collections.abc import Callable

import torch
from torch import nn

from pagedllm.layers.quantization.base_config import new_weight

WeightLoader = Callable[..., None]
Block = tuple[int, int]
"""(block_size, type_size): rows stored as blocks of block_size weights in type_size bytes."""


def new_parameter(shape: tuple[int, ...], weight_loader: WeightLoader) -> nn.Parameter:
    """An uninitialised parameter in the default dtype and device, with its loader attached."""
    return new_weight(shape, torch.get_default_dtype(), weight_loader=weight_loader)


def block_of(param: torch.Tensor) -> Block | None:
    """The block format of a quantized parameter's rows, None for a float one."""
    return getattr(param, "block", None)


def columns(t: torch.Tensor, block: Block | None) -> int:
    """The number of weights in each row of t (its last dim, or its blocks' weights)."""
    return t.shape[-1] if block is None else t.shape[-1] // block[1] * block[0]


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
    loaded_weight: torch.Tensor,
    dim: int,
    rank: int,
    size: int,
    num_shards: int,
    block: Block | None = None,
) -> torch.Tensor:
    """Shard `rank` of `num_shards` equal slices of `size` along `dim`; the checkpoint
    tensor must hold exactly num_shards * size there. With a block format, the last dim
    counts weights (its bytes hold whole blocks) and a shard must not cut a block."""
    last = dim in (-1, loaded_weight.dim() - 1)
    length = columns(loaded_weight, block) if last else loaded_weight.shape[dim]
    if length != num_shards * size:
        raise ValueError(
            f"checkpoint tensor of shape {tuple(loaded_weight.shape)} has {length} along dim "
            f"{dim}, the model expects {num_shards} x {size} = {num_shards * size}"
        )
    if block is None or not last:
        return loaded_weight.narrow(dim, rank * size, size)
    block_size, type_size = block
    if size % block_size:
        raise ValueError(
            f"a shard of {size} columns would cut this quantized tensor's blocks of "
            f"{block_size}: choose a tensor parallel size that splits its rows into whole "
            "blocks"
        )
    shard_bytes = size // block_size * type_size
    return loaded_weight.narrow(dim, rank * shard_bytes, shard_bytes)
