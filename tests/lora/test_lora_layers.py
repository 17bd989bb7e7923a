"""pagedllm/lora/layers.py: LoRASlots on the linear layers. Reference: PEFT's formula per
row, y + (x A^T) B^T for each checkpoint matrix fused in the layer (A [r, in], B [out, r],
the scaling folded into B), in torch; rows of no slot keep the layer's output bit for bit.
At tp = 2 each rank's layer holds its share (tests/layers/test_linear.py's layouts): the
column-parallel ranks' outputs are columns of the tp = 1 result, row-parallel partials sum
to it."""

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pagedllm.distributed.parallel_state import override_tensor_parallel
from pagedllm.layers.linear import (
    ColumnParallelLinear,
    LinearBase,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from pagedllm.lora.layers import LoRAMapping, LoRASlots, output_shards, set_lora_mapping

HIDDEN, HEAD, MAX_RANK, MAX_LORAS = 16, 4, 4, 3
BuildPerRank = Callable[[Callable[[], nn.Module], int], list[nn.Module]]
Pair = tuple[torch.Tensor, torch.Tensor]


class Case:
    """A layer kind: its factory, its checkpoint matrices' (rows, shard id), and which
    columns of the whole output rank r of tp computes (None: all, partial sums)."""

    def __init__(
        self,
        make: Callable[[], LinearBase],
        subs: list[tuple[int, object]],
        in_features: int = HIDDEN,
        kv_heads: int | None = None,
    ) -> None:
        self.make, self.subs, self.in_features, self.kv_heads = make, subs, in_features, kv_heads

    def columns(self, rank: int, tp: int) -> torch.Tensor | None:
        if self.make is row_parallel:
            return None
        offsets = torch.tensor([0] + [rows for rows, _ in self.subs]).cumsum(0)
        parts = []
        for i, (rows, _) in enumerate(self.subs):
            shards, shard = tp, rank
            if self.kv_heads is not None and i > 0 and self.kv_heads < tp:
                shards, shard = self.kv_heads, rank // (tp // self.kv_heads)
            size = rows // shards
            parts.append(torch.arange(size) + offsets[i] + shard * size)
        return torch.cat(parts)


def row_parallel() -> LinearBase:
    return RowParallelLinear(24, HIDDEN, bias=True)


CASES = {
    "column": Case(lambda: ColumnParallelLinear(HIDDEN, 8, bias=True), [(8, None)]),
    "merged": Case(
        lambda: MergedColumnParallelLinear(HIDDEN, [8, 12], bias=True), [(8, 0), (12, 1)]
    ),
    "qkv-gqa": Case(
        lambda: QKVParallelLinear(HIDDEN, HEAD, 4, 2, bias=True),
        [(16, "q"), (8, "k"), (8, "v")],
        kv_heads=2,
    ),
    "qkv-mqa": Case(
        lambda: QKVParallelLinear(HIDDEN, HEAD, 4, 1, bias=True),
        [(16, "q"), (4, "k"), (4, "v")],
        kv_heads=1,
    ),
    "row": Case(row_parallel, [(HIDDEN, None)], in_features=24),
}


def checkpoint(case: Case) -> list[Pair]:
    """Each checkpoint matrix's (W [rows, in], b [rows])."""
    return [(torch.randn(rows, case.in_features), torch.randn(rows)) for rows, _ in case.subs]


def adapter(case: Case, ranks: list[int | None]) -> list[Pair | None]:
    """(A [r, in], B * scaling [out, r]) per checkpoint matrix (None: not adapted)."""
    return [
        None if r is None else (torch.randn(r, case.in_features), torch.randn(rows, r))
        for r, (rows, _) in zip(ranks, case.subs, strict=True)
    ]


def build(case: Case, weights: list[Pair], adapters: dict[int, list[Pair | None]]) -> LinearBase:
    """The case's layer (of the tensor parallel rank it is built under) with `weights`
    loaded and each slot of `adapters` set."""
    layer = case.make()
    for (w, b), (_, shard_id) in zip(weights, case.subs, strict=True):
        layer.weight.weight_loader(layer.weight, w, shard_id)
        layer.bias.weight_loader(layer.bias, b, shard_id)
    layer.lora = LoRASlots(layer, len(case.subs), MAX_LORAS, MAX_RANK, torch.float32, "cpu")
    for slot, pairs in adapters.items():
        layer.lora.set_slot(slot, pairs)
    return layer


def reference(
    x: torch.Tensor, weights: list[Pair], pairs: list[Pair | None] | None
) -> torch.Tensor:
    """The whole (tp = 1) output of x's rows, each sub-matrix adapted by its pair."""
    outs = []
    for i, (w, b) in enumerate(weights):
        y = F.linear(x, w, b)
        if pairs is not None and pairs[i] is not None:
            a, lora_b = pairs[i]
            y = y + (x @ a.T) @ lora_b.T
        outs.append(y)
    return torch.cat(outs, dim=-1)


# Rows 0, 3: slot 2; row 1: slot 0; rows 2, 4: no adapter.
ROW_SLOTS = [2, 0, None, 2, None]


def mapping(row_slots: list[int | None]) -> LoRAMapping:
    slots = tuple(sorted({s for s in row_slots if s is not None}))
    rows = torch.tensor([-1 if s is None else s for s in row_slots], dtype=torch.int32)
    return LoRAMapping(rows, slots)


def two_adapters(case: Case) -> dict[int, list[Pair | None]]:
    """Slot 2: every sub-matrix, ranks below MAX_RANK; slot 0: the first one alone at
    MAX_RANK (a fused layer's others not adapted); slot 1 empty."""
    n = len(case.subs)
    return {
        2: adapter(case, [1 + i % MAX_RANK for i in range(n)]),
        0: adapter(case, [MAX_RANK] + [None] * (n - 1)),
    }


@pytest.mark.parametrize("name", list(CASES))
def test_each_row_adds_its_slot_s_delta_at_tp1(name: str) -> None:
    case = CASES[name]
    weights, adapters = checkpoint(case), two_adapters(case)
    layer = build(case, weights, adapters)
    x = torch.randn(len(ROW_SLOTS), case.in_features)
    base = layer(x)  # no mapping: no row adapted
    torch.testing.assert_close(base, reference(x, weights, None))
    with set_lora_mapping(mapping(ROW_SLOTS)):
        out = layer(x)
    for row, slot in enumerate(ROW_SLOTS):
        expected = reference(x[row : row + 1], weights, adapters.get(slot))
        torch.testing.assert_close(out[row : row + 1], expected)
        if slot is None:
            assert torch.equal(out[row], base[row]), f"row {row} of no adapter changed"
    assert layer(x).equal(base), "the mapping outlived its context"


def test_set_slot_lays_sub_matrices_block_diagonally() -> None:
    """qkv: A's stacked at rows i * R, B's at (their output rows, columns i * R); what a
    smaller rank or a missing sub-matrix leaves is zero, whatever the slot held before."""
    case = CASES["qkv-gqa"]
    layer = build(case, checkpoint(case), {1: adapter(case, [MAX_RANK] * 3)})
    pairs = adapter(case, [2, None, 3])
    layer.lora.set_slot(1, pairs)
    a = torch.zeros(3 * MAX_RANK, HIDDEN)
    b = torch.zeros(32, 3 * MAX_RANK)
    (a_q, b_q), (a_v, b_v) = pairs[0], pairs[2]
    a[0:2], b[0:16, 0:2] = a_q, b_q
    a[8:11], b[24:32, 8:11] = a_v, b_v
    assert torch.equal(layer.lora.lora_a[1], a) and torch.equal(layer.lora.lora_b[1], b)
    assert not layer.lora.lora_a[0].any() and not layer.lora.lora_b[2].any()


@pytest.mark.parametrize(
    "make, rank, expected",
    [
        (lambda: ColumnParallelLinear(HIDDEN, 8), 1, [(0, 4, 1, 2)]),
        (lambda: MergedColumnParallelLinear(HIDDEN, [8, 12]), 1, [(0, 4, 1, 2), (4, 6, 1, 2)]),
        (
            lambda: QKVParallelLinear(HIDDEN, HEAD, 4, 2),
            1,
            [(0, 8, 1, 2), (8, 4, 1, 2), (12, 4, 1, 2)],
        ),
        (  # one kv head, replicated on both ranks: whole on each
            lambda: QKVParallelLinear(HIDDEN, HEAD, 4, 1),
            1,
            [(0, 8, 1, 2), (8, 4, 0, 1), (12, 4, 0, 1)],
        ),
        (lambda: RowParallelLinear(24, HIDDEN), 1, [(0, HIDDEN, 0, 1)]),
    ],
    ids=["column", "merged", "qkv-gqa", "qkv-mqa", "row"],
)
def test_output_shards_at_tp2(make: Callable, rank: int, expected: list) -> None:
    """(offset in this rank's output, rows, shard, shards) as tests/layers/test_linear.py
    finds the weight_loader cuts the checkpoint."""
    with override_tensor_parallel(rank, 2):
        layer = make()
    assert output_shards(layer) == expected


@pytest.mark.parametrize("name", list(CASES))
def test_rank_shards_at_tp2_make_the_tp1_result(name: str, build_per_rank: BuildPerRank) -> None:
    case = CASES[name]
    weights, adapters = checkpoint(case), two_adapters(case)
    whole = build(case, weights, adapters)
    ranks = build_per_rank(lambda: build(case, weights, adapters), 2)
    x = torch.randn(len(ROW_SLOTS), case.in_features)
    with set_lora_mapping(mapping(ROW_SLOTS)):
        expected = whole(x)
        if case.columns(0, 2) is None:  # row-parallel: each rank's input columns
            partials = [layer(part) for layer, part in zip(ranks, x.chunk(2, -1), strict=True)]
            torch.testing.assert_close(sum(partials), expected)
            return
        for rank, layer in enumerate(ranks):
            torch.testing.assert_close(layer(x), expected[:, case.columns(rank, 2)])
