"""Linear layers against F.linear on the full (unsharded) checkpoint weights.

tp > 1 is checked shard by shard: each rank's layer is built under override_tensor_parallel,
loads the same full tensors through its weight_loader, and must hold exactly its slice;
concatenated column outputs / summed row partials must reproduce the full result.
"""

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pagedllm.distributed.parallel_state import override_tensor_parallel
from pagedllm.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
)

HIDDEN = 16
BuildPerRank = Callable[[Callable[[], nn.Module], int], list[nn.Module]]


def _load(param: nn.Parameter, weight: torch.Tensor, shard_id: object = None) -> None:
    param.weight_loader(param, weight, shard_id)


def _assert_equal(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)


@pytest.mark.parametrize("tp_size", [1, 2])
def test_replicated_linear_holds_the_whole_matrix_and_equals_f_linear(tp_size: int) -> None:
    """Reference: F.linear(x, W, b) on every rank."""
    w, b, x = torch.randn(8, HIDDEN), torch.randn(8), torch.randn(3, HIDDEN)
    with override_tensor_parallel(tp_size - 1, tp_size):
        layer = ReplicatedLinear(HIDDEN, 8, bias=True)
    _load(layer.weight, w)
    _load(layer.bias, b)
    _assert_equal(layer.weight.data, w)
    torch.testing.assert_close(layer(x), F.linear(x, w, b))


@pytest.mark.parametrize("tp_size", [1, 2, 4])
def test_column_parallel_shards_concatenate_to_f_linear(
    tp_size: int, build_per_rank: BuildPerRank
) -> None:
    """Reference: F.linear(x, W, b); rank r holds rows [r*O/P, (r+1)*O/P) of W and b."""
    w, b, x = torch.randn(8, HIDDEN), torch.randn(8), torch.randn(3, HIDDEN)
    layers = build_per_rank(lambda: ColumnParallelLinear(HIDDEN, 8, bias=True), tp_size)
    for rank, layer in enumerate(layers):
        _load(layer.weight, w)
        _load(layer.bias, b)
        _assert_equal(layer.weight.data, w.chunk(tp_size)[rank])
        _assert_equal(layer.bias.data, b.chunk(tp_size)[rank])
    out = torch.cat([layer(x) for layer in layers], dim=-1)
    torch.testing.assert_close(out, F.linear(x, w, b))


@pytest.mark.parametrize("tp_size", [1, 2, 4])
def test_merged_column_parallel_rank_holds_gate_and_up_slices(
    tp_size: int, build_per_rank: BuildPerRank
) -> None:
    """Reference: F.linear with gate_proj and up_proj; rank r's output is [gate_r, up_r]."""
    inter = 8
    gate, up = torch.randn(inter, HIDDEN), torch.randn(inter, HIDDEN)
    gate_b, up_b = torch.randn(inter), torch.randn(inter)
    x = torch.randn(3, HIDDEN)
    layers = build_per_rank(
        lambda: MergedColumnParallelLinear(HIDDEN, [inter, inter], bias=True), tp_size
    )
    gate_out, up_out = F.linear(x, gate, gate_b), F.linear(x, up, up_b)
    for rank, layer in enumerate(layers):
        for shard_id, (w, b) in enumerate([(gate, gate_b), (up, up_b)]):
            _load(layer.weight, w, shard_id)
            _load(layer.bias, b, shard_id)
        expected = torch.cat(
            [gate_out.chunk(tp_size, -1)[rank], up_out.chunk(tp_size, -1)[rank]], -1
        )
        torch.testing.assert_close(layer(x), expected)
    if tp_size == 1:
        full = F.linear(x, torch.cat([gate, up]), torch.cat([gate_b, up_b]))
        torch.testing.assert_close(layers[0](x), full)


def _gqa_heads_of_rank(rank: int, tp_size: int, heads: int, kv_heads: int) -> tuple[list, list]:
    """The query heads rank r computes and the kv heads those queries attend to (GQA)."""
    per_rank = heads // tp_size
    q_heads = list(range(rank * per_rank, (rank + 1) * per_rank))
    group = heads // kv_heads
    return q_heads, sorted({h // group for h in q_heads})


def _rows_of_heads(t: torch.Tensor, heads: list, head_size: int) -> torch.Tensor:
    return torch.cat([t[h * head_size : (h + 1) * head_size] for h in heads])


@pytest.mark.parametrize(
    "tp_size, heads, kv_heads",
    [(1, 8, 2), (2, 8, 2), (4, 8, 2), (8, 8, 2), (2, 4, None), (4, 8, 8)],
)
def test_qkv_parallel_rank_holds_its_query_heads_and_their_kv_heads(
    tp_size: int, heads: int, kv_heads: int | None, build_per_rank: BuildPerRank
) -> None:
    """Reference: GQA, query head h attends kv head h // (heads / kv_heads); F.linear on
    those rows of q_proj, k_proj, v_proj. With kv_heads < tp a kv head is replicated."""
    head_size, total_kv = 4, kv_heads or heads
    q = torch.randn(heads * head_size, HIDDEN), torch.randn(heads * head_size)
    k = torch.randn(total_kv * head_size, HIDDEN), torch.randn(total_kv * head_size)
    v = torch.randn(total_kv * head_size, HIDDEN), torch.randn(total_kv * head_size)
    x = torch.randn(3, HIDDEN)
    layers = build_per_rank(
        lambda: QKVParallelLinear(HIDDEN, head_size, heads, kv_heads, bias=True), tp_size
    )
    for rank, layer in enumerate(layers):
        for shard_id, (w, b) in zip("qkv", [q, k, v], strict=True):
            _load(layer.weight, w, shard_id)
            _load(layer.bias, b, shard_id)
        q_heads, kv = _gqa_heads_of_rank(rank, tp_size, heads, total_kv)
        assert (layer.num_heads, layer.num_kv_heads) == (len(q_heads), len(kv))
        parts = [(q, q_heads), (k, kv), (v, kv)]
        expected_w = torch.cat([_rows_of_heads(t[0], hs, head_size) for t, hs in parts])
        expected_b = torch.cat([_rows_of_heads(t[1], hs, head_size) for t, hs in parts])
        _assert_equal(layer.weight.data, expected_w)
        _assert_equal(layer.bias.data, expected_b)
        torch.testing.assert_close(layer(x), F.linear(x, expected_w, expected_b))


@pytest.mark.parametrize(
    "heads, kv_heads, expected_rows",
    [(64, 8, (8 + 2 * 1) * 128), (32, 4, (4 + 2 * 1) * 128)],
    ids=["deepseek-r1-distill-llama-70b", "qwen3-30b-a3b"],
)
def test_qkv_shard_shapes_of_the_target_models_at_tp8(
    heads: int, kv_heads: int, expected_rows: int
) -> None:
    """Reference: the target models' head counts; each of 8 ranks holds heads/8 query heads
    and one kv head (Qwen3's 4 kv heads are each replicated on 2 ranks)."""
    hidden = 8192 if heads == 64 else 2048
    with torch.device("meta"), override_tensor_parallel(7, 8):
        layer = QKVParallelLinear(hidden, 128, heads, kv_heads)
    assert layer.weight.shape == (expected_rows, hidden)


def test_row_parallel_tp1_equals_f_linear_with_bias() -> None:
    """Reference: F.linear(x, W, b)."""
    w, b, x = torch.randn(HIDDEN, 8), torch.randn(HIDDEN), torch.randn(3, 8)
    layer = RowParallelLinear(8, HIDDEN, bias=True)
    _load(layer.weight, w)
    _load(layer.bias, b)
    torch.testing.assert_close(layer(x), F.linear(x, w, b))


@pytest.mark.parametrize("tp_size", [2, 4])
def test_row_parallel_partial_outputs_sum_to_f_linear(
    tp_size: int, build_per_rank: BuildPerRank
) -> None:
    """Reference: F.linear(x, W) = sum over r of F.linear(x_r, W[:, cols_r])."""
    w, x = torch.randn(HIDDEN, 8), torch.randn(3, 8)
    layers = build_per_rank(lambda: RowParallelLinear(8, HIDDEN, reduce_results=False), tp_size)
    partials = []
    for rank, layer in enumerate(layers):
        _load(layer.weight, w)
        _assert_equal(layer.weight.data, w.chunk(tp_size, dim=1)[rank])
        partials.append(layer(x.chunk(tp_size, dim=-1)[rank]))
    torch.testing.assert_close(torch.stack(partials).sum(0), F.linear(x, w))


def test_weight_loaders_reject_checkpoint_tensors_of_the_wrong_shape() -> None:
    """Reference: the message names the checkpoint shape and the expected one."""
    column = ColumnParallelLinear(HIDDEN, 8)
    with pytest.raises(ValueError, match=r"shape mismatch: checkpoint has \(8, 17\).*\(8, 16\)"):
        _load(column.weight, torch.randn(8, HIDDEN + 1))
    merged = MergedColumnParallelLinear(HIDDEN, [8, 8])
    with pytest.raises(ValueError, match=r"shard 1 shape mismatch"):
        _load(merged.weight, torch.randn(8, HIDDEN + 1), 1)
    qkv = QKVParallelLinear(HIDDEN, 4, 4, 2)
    with pytest.raises(ValueError, match=r"k_proj shape mismatch"):
        _load(qkv.weight, torch.randn(8, HIDDEN - 1), "k")
    with override_tensor_parallel(1, 2):
        row = RowParallelLinear(8, HIDDEN)
    with pytest.raises(ValueError, match=r"has 6 along dim 1, the model expects 2 x 4 = 8"):
        _load(row.weight, torch.randn(HIDDEN, 6))
    with pytest.raises(ValueError, match=r"has 10 along dim 1, the model expects 2 x 4 = 8"):
        _load(row.weight, torch.randn(HIDDEN, 10))


@pytest.mark.parametrize("shard_id", ["x", 0, None, "qkv"])
def test_qkv_rejects_unknown_shard_ids(shard_id: object) -> None:
    """Reference: shard ids are the checkpoint's q_proj, k_proj, v_proj -> 'q', 'k', 'v'."""
    qkv = QKVParallelLinear(HIDDEN, 4, 4, 2)
    with pytest.raises(ValueError, match=r"shard_id .* must be one of 'q', 'k', 'v'"):
        _load(qkv.weight, torch.randn(16, HIDDEN), shard_id)


@pytest.mark.parametrize("shard_id", [2, -1, "0", None])
def test_merged_column_rejects_out_of_range_shard_ids(shard_id: object) -> None:
    """Reference: shard ids index output_sizes, here [0, 2)."""
    merged = MergedColumnParallelLinear(HIDDEN, [8, 8])
    with pytest.raises(ValueError, match=r"shard_id .* must be in \[0, 2\)"):
        _load(merged.weight, torch.randn(8, HIDDEN), shard_id)


@pytest.mark.parametrize(
    "factory, message",
    [
        (lambda: ColumnParallelLinear(HIDDEN, 10), "output size 10 is not divisible by"),
        (lambda: RowParallelLinear(10, HIDDEN), "input size 10 is not divisible by"),
        (lambda: QKVParallelLinear(HIDDEN, 4, 6, 2), "number of attention heads 6"),
        (lambda: QKVParallelLinear(HIDDEN, 4, 12, 6), "number of kv heads 6"),
        (lambda: QKVParallelLinear(HIDDEN, 4, 12, 3), "kv heads"),
    ],
    ids=["column-out", "row-in", "q-heads", "kv-heads", "kv-replicas"],
)
def test_sizes_not_divisible_by_tp4_raise(factory: Callable[[], nn.Module], message: str) -> None:
    """Reference: Megatron-style sharding needs every split size divisible by tp."""
    with override_tensor_parallel(0, 4), pytest.raises(ValueError, match=message):
        factory()


def test_merged_column_with_a_sub_size_not_divisible_by_tp_raises() -> None:
    """Reference: gate and up are sharded separately, so each must divide by tp (6 by 4)."""
    with pytest.raises(ValueError, match="output size 6 is not divisible by"):
        with override_tensor_parallel(0, 4):
            merged = MergedColumnParallelLinear(HIDDEN, [6, 6])
        _load(merged.weight, torch.randn(6, HIDDEN), 0)
