"""LoRA on the linear layers: every targeted layer holds max_loras slots of adapter weights,
and each row of a step adds its slot's (x A^T) B^T to the layer's output.

A slot of a layer that fuses n checkpoint matrices (qkv_proj: q, k, v; gate_up_proj: gate,
up) stacks their A's as [n * R, in] and lays their B's block-diagonally in [out, n * R]
(R = max_lora_rank; a smaller rank's rows and columns stay zero), so one pair of matmuls
gives every sub-matrix's delta. Under tensor parallelism a slot holds this rank's share,
cut as the base weight is: B's rows for column-parallel layers, A's columns for row-parallel
ones (whose partial deltas the layer's all-reduce sums with its output).

Each slot a step uses is multiplied over all of the step's rows and added to the rows that
use it (`_custom_ops.lora_masked_add`: the other rows stay as they are): a row's delta is
its own adapter's, computed by the same kernels in the same order whatever rows, slots or
other adapters share the step (`_custom_ops.linear` sums every row in one order on the CPU),
and a row without an adapter keeps the base layer's output bit for bit. A captured decode
step (executor/cpu_graph.py) applies the slots of its capture, its rows' slots in a static
buffer; each row still gets only its own slot's delta, so replayed and eager steps agree
bit for bit.
"""

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from pagedllm._custom_ops import linear, lora_masked_add
from pagedllm.layers.linear import (
    ColumnParallelLinear,
    LinearBase,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from pagedllm.layers.parameter import shard_of


@dataclass(frozen=True)
class LoRAMapping:
    """vLLM's name: which slot each of a step's rows runs with. `row_slots` [T] int32 (-1:
    no adapter); `slots`: the slots to apply (those the rows use, or a captured step's)."""

    row_slots: torch.Tensor
    slots: tuple[int, ...]


class _StepMapping(threading.local):
    """The running step's mapping, per thread (as forward_context.py's metadata)."""

    mapping: LoRAMapping | None = None


_step = _StepMapping()


def current_lora_mapping() -> LoRAMapping | None:
    """The running step's mapping (None: no adapter rows)."""
    return _step.mapping


@contextmanager
def set_lora_mapping(mapping: LoRAMapping | None) -> Iterator[None]:
    """The step's rows by slot, read by every LoRA layer of its forward."""
    previous, _step.mapping = _step.mapping, mapping
    try:
        yield
    finally:
        _step.mapping = previous


class LoRASlots:
    """One layer's adapter weights: lora_a [max_loras, n * R, in], lora_b [max_loras, out,
    n * R], in the activations' dtype, this rank's share."""

    def __init__(
        self,
        layer: LinearBase,
        num_subs: int,
        max_loras: int,
        max_rank: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.layer = layer
        self.max_rank = max_rank
        width = num_subs * max_rank
        self.lora_a = torch.zeros(max_loras, width, layer.input_size, dtype=dtype, device=device)
        self.lora_b = torch.zeros(max_loras, layer.output_size, width, dtype=dtype, device=device)

    def set_slot(self, slot: int, weights: list[tuple[torch.Tensor, torch.Tensor] | None]) -> None:
        """Slot `slot` takes one (A [r, in], B [out, r]) per sub-matrix, whole as in the
        checkpoint (None: the adapter leaves that sub-matrix alone)."""
        self.lora_a[slot].zero_()
        self.lora_b[slot].zero_()
        shards = output_shards(self.layer)
        for i, pair in enumerate(weights):
            if pair is None:
                continue
            a, b = pair
            cols = slice(i * self.max_rank, i * self.max_rank + a.shape[0])
            if isinstance(self.layer, RowParallelLinear):
                size, tp = self.layer.input_size, self.layer
                a = shard_of(a, 1, tp.tp_rank, size, tp.tp_size)
            offset, size, shard, num_shards = shards[i]
            b = shard_of(b, 0, shard, size, num_shards)
            self.lora_a[slot, cols].copy_(a)
            self.lora_b[slot, offset : offset + size, cols].copy_(b)

    def add_to(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """y [T, out] (the layer's output for x [T, in]) plus each row's adapter delta."""
        mapping = _step.mapping
        if mapping is None:
            return y
        for slot in mapping.slots:
            delta = linear(linear(x, self.lora_a[slot]), self.lora_b[slot])
            y = lora_masked_add(y, delta, mapping.row_slots, slot)
        return y


def output_shards(layer: LinearBase) -> list[tuple[int, int, int, int]]:
    """For each checkpoint matrix fused in the layer: (offset of its rows in this rank's
    output, their number, which shard of the checkpoint's rows they are, of how many), as
    the layer's weight_loader cuts them."""
    if isinstance(layer, QKVParallelLinear):
        q_size = layer.num_heads * layer.head_size
        kv_size = layer.num_kv_heads * layer.head_size
        kv_rank = layer.tp_rank // layer.num_kv_replicas
        kv_shards = layer.tp_size // layer.num_kv_replicas
        return [
            (0, q_size, layer.tp_rank, layer.tp_size),
            (q_size, kv_size, kv_rank, kv_shards),
            (q_size + kv_size, kv_size, kv_rank, kv_shards),
        ]
    if isinstance(layer, MergedColumnParallelLinear):
        sizes = layer.shard_sizes
        return [
            (sum(sizes[:i]), size, layer.tp_rank, layer.tp_size) for i, size in enumerate(sizes)
        ]
    if isinstance(layer, ColumnParallelLinear):
        return [(0, layer.output_size, layer.tp_rank, layer.tp_size)]
    return [(0, layer.output_size, 0, 1)]
