"""LoRA on the linear layers: every targeted layer holds max_loras slots of adapter weights,
and each row of a step adds its slot's (x A^T) B^T to the layer's output.

A slot of a layer that fuses n checkpoint matrices (qkv_proj: q, k, v; gate_up_proj: gate,
up) stacks their A's as [n * R, in] and lays their B's block-diagonally in [out, n * R]
(R = max_lora_rank; a smaller rank's rows and columns stay zero), so one pair of matmuls
gives every sub-matrix's delta. Under tensor parallelism a slot holds this rank's share,
cut as the base weight is: B's rows for column-parallel layers, A's columns for row-parallel
ones (whose partial deltas the layer's all-reduce sums with its output).

Each slot a step uses is multiplied over all of the step's rows and kept where the row's
mask is set: a row's delta is its own adapter's, computed by the same kernels in the same
order whatever rows, slots or other adapters share the step (`_custom_ops.linear` sums
every row in one order on the CPU), and a row without an adapter adds exact zeros.
"""

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from pagedllm._custom_ops import linear
from pagedllm.layers.linear import (
    ColumnParallelLinear,
    LinearBase,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from pagedllm.layers.parameter import shard_of

# (slot, [T, 1] bool: the rows that use it, or None: all of them) for each slot the running
# step uses.
_step_slots: list[tuple[int, torch.Tensor | None]] = []


@contextmanager
def set_lora_mapping(slots: list[tuple[int, torch.Tensor | None]]) -> Iterator[None]:
    """The step's rows by slot, read by every LoRA layer of its forward."""
    global _step_slots
    previous, _step_slots = _step_slots, slots
    try:
        yield
    finally:
        _step_slots = previous


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
        """y (the layer's output for x) plus each row's adapter delta."""
        for slot, rows in _step_slots:
            delta = linear(linear(x, self.lora_a[slot]), self.lora_b[slot])
            y = y + (delta if rows is None else torch.where(rows, delta, 0))
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
