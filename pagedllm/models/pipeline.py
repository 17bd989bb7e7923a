"""A model's share of a pipeline (vLLM's make_layers, PPMissingLayer, IntermediateTensors).

A stage builds only its contiguous slice of decoder layers; the others, and the embedding,
norm or LM head another stage holds, are PPMissingLayer: no parameters, so their
checkpoint tensors are skipped by name before they are read (`owns_weight`). A stage
before the last returns IntermediateTensors, which the next one continues from.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from pagedllm.distributed.layer_partition import get_pp_indices
from pagedllm.distributed.parallel_state import get_pp_group


@dataclass
class IntermediateTensors:
    """What one stage hands the next: `hidden_states` and `residual`, both [T, hidden]."""

    tensors: dict[str, torch.Tensor]

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.tensors[key]


class PPMissingLayer(nn.Identity):
    """A module another pipeline stage holds: no parameters here."""


def make_layers(
    num_hidden_layers: int, layer_fn: Callable[[int], nn.Module]
) -> tuple[int, int, nn.ModuleList]:
    """(start, end, layers): layer_fn(i) for this stage's [start, end), PPMissingLayer for
    the rest, so layer i keeps its checkpoint name model.layers.i on every stage."""
    pp = get_pp_group()
    start, end = get_pp_indices(num_hidden_layers, pp.rank_in_group, pp.world_size)
    layers = [
        layer_fn(i) if start <= i < end else PPMissingLayer() for i in range(num_hidden_layers)
    ]
    return start, end, nn.ModuleList(layers)


def layer_index(prefix: str) -> int:
    """The decoder layer a module of that prefix belongs to ("model.layers.3.self_attn" ->
    3), as vLLM's extract_layer_index."""
    parts = prefix.split(".")
    indices = [int(p) for p in parts if p.isdigit()]
    if len(indices) != 1:
        raise ValueError(f"prefix {prefix!r} names no single layer index")
    return indices[0]


def missing_prefixes(model: nn.Module) -> tuple[str, ...]:
    """The name prefixes of the model's PPMissingLayers ("model.layers.3.", "lm_head.")."""
    return tuple(f"{name}." for name, m in model.named_modules() if isinstance(m, PPMissingLayer))


def weight_filter(model: nn.Module) -> Callable[[str], bool]:
    """Whether a checkpoint tensor's name belongs to this stage's part of the model."""
    missing = missing_prefixes(model)
    return lambda name: not missing or not name.startswith(missing)
