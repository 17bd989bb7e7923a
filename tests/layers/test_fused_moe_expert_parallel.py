"""Expert parallelism in FusedMoE (pagedllm/layers/fused_moe.py), one rank at a time in this
process (override_tensor_parallel + set_expert_parallel, no process group). References:
vLLM's determine_expert_map placement (contiguous runs, the remainder on the first ranks),
the checkpoint (each rank holds its experts' matrices whole, GGUF blocks byte for byte) and
the one-rank layer, whose output the ranks' partial outputs sum to (the all-reduce forms
that sum in a real run; tests/executor/test_multiproc_expert_parallel.py runs one)."""

from collections.abc import Iterator
from contextlib import contextmanager

import gguf
import numpy as np
import pytest
import torch
from torch import nn

from pagedllm.config import ModelConfig
from pagedllm.distributed.parallel_state import override_tensor_parallel, set_expert_parallel
from pagedllm.layers.fused_moe import FusedMoE, determine_expert_map, local_expert_range
from pagedllm.model_loader.loader import build_model, get_quant_config, iterate_weights
from tests.layers.quantization.quantized_gguf import write_quantized_gguf
from tests.layers.test_fused_moe import checkpoint_of, fused_like, inputs, make_block


@contextmanager
def ep_rank(rank: int, size: int) -> Iterator[None]:
    """Build layers as rank `rank` of `size` with enable_expert_parallel."""
    with override_tensor_parallel(rank, size), set_expert_parallel(True):
        yield


@pytest.mark.parametrize(
    "num_experts, size, counts",
    [(8, 2, [4, 4]), (8, 4, [2, 2, 2, 2]), (6, 4, [2, 2, 1, 1]), (10, 4, [3, 3, 2, 2])],
)
def test_determine_expert_map_places_contiguous_runs_remainder_first(
    num_experts: int, size: int, counts: list[int]
) -> None:
    owner = torch.full((num_experts,), -1)
    for rank in range(size):
        local, expert_map = determine_expert_map(size, rank, num_experts)
        start = sum(counts[:rank])
        assert local == counts[rank] == len(local_expert_range(size, rank, num_experts))
        held = (expert_map >= 0).nonzero().flatten()
        assert held.tolist() == list(range(start, start + local))
        assert expert_map[held].tolist() == list(range(local))
        assert (owner[held] == -1).all()
        owner[held] = rank
    assert (owner >= 0).all(), "every expert is held by exactly one rank"
    assert determine_expert_map(1, 0, num_experts) == (num_experts, None)


@pytest.mark.parametrize("num_experts, size", [(8, 2), (8, 4), (6, 4), (5, 3)])
@torch.no_grad()
def test_ranks_hold_whole_experts_and_their_partials_sum_to_one_rank(
    num_experts: int, size: int
) -> None:
    """Every rank routes all tokens over all experts and runs only its own: the partials
    (zero where a token's experts are elsewhere) add up to the one-rank output."""
    block = make_block(num_experts, 2, 32, 16, True)
    x, router_logits = inputs(block, 37)
    expected = fused_like(block)(x, router_logits)
    checkpoint = checkpoint_of(block)
    partials = []
    for rank in range(size):
        with ep_rank(rank, size):
            layer = fused_like(block, reduce_results=False)
        local = local_expert_range(size, rank, num_experts)
        assert layer.w13_weight.shape == (len(local), 32, 32)  # whole: 2 x 16 rows
        assert layer.w2_weight.shape == (len(local), 32, 16)
        for i, e in enumerate(local):
            gate, up = (checkpoint[f"mlp.experts.{e}.{p}_proj.weight"] for p in ("gate", "up"))
            assert torch.equal(layer.w13_weight[i], torch.cat([gate, up]))
            assert torch.equal(layer.w2_weight[i], checkpoint[f"mlp.experts.{e}.down_proj.weight"])
        partials.append(layer(x, router_logits))
    assert not torch.allclose(partials[0], expected, atol=1e-3)
    assert (sum(partials) - expected).abs().max().item() <= 1e-5


def test_experts_stay_whole_where_tp_would_not_divide_them() -> None:
    """Intermediate 16 over 3 ranks cannot be split; whole experts need no split."""
    with ep_rank(2, 3):
        layer = FusedMoE(8, 2, 32, 16)
    assert (layer.local_num_experts, layer.intermediate_size_per_partition) == (2, 16)
    assert layer.local_experts == range(6, 8)


def test_fewer_experts_than_ranks_is_an_error() -> None:
    with ep_rank(0, 4), pytest.raises(ValueError, match="over 4 ranks.*has 2 experts"):
        FusedMoE(2, 1, 32, 16)


def test_weight_loader_skips_other_ranks_experts_after_checking_them() -> None:
    with ep_rank(1, 2):
        layer = FusedMoE(8, 2, 32, 16)
    param = layer.w13_weight
    param.data.fill_(7.0)
    layer.weight_loader(param, torch.zeros(16, 32), shard_id="w1", expert_id=0)  # rank 0's
    assert (param.data == 7.0).all()
    layer.weight_loader(param, torch.zeros(16, 32), shard_id="w1", expert_id=4)  # local 0
    assert (param.data[0, :16] == 0).all() and (param.data[1:] == 7.0).all()
    with pytest.raises(ValueError, match=r"expert 0 gate_proj shape mismatch"):
        layer.weight_loader(param, torch.zeros(32, 16), shard_id="w1", expert_id=0)
    with pytest.raises(ValueError, match=r"expert_id 8 must be in \[0, 8\)"):
        layer.weight_loader(param, torch.zeros(16, 32), shard_id="w1", expert_id=8)


NUM_EXPERTS = 6


@pytest.fixture(scope="module")
def moe_gguf(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny Qwen3-MoE GGUF with 6 experts whose down projections are Q4_K rows of 256,
    one block each (tests/layers/quantization/quantized_gguf.py): two TP ranks would cut
    every block."""
    path = str(tmp_path_factory.mktemp("moe") / "qwen3moe.gguf")
    write_quantized_gguf(path, "qwen3moe", num_experts=NUM_EXPERTS)
    return path


def loaded_model(path: str, rank: int, size: int) -> nn.Module:
    """Rank `rank` of `size`'s model with its weights loaded as stored (not yet packed)."""
    config = ModelConfig.create(path, "float32")
    quant_config = get_quant_config(config)
    with ep_rank(rank, size):
        model = build_model(config, "cpu", quant_config)
    with torch.no_grad():
        model.load_weights(iterate_weights(config, quant_config))
    return model


def test_tp_cuts_the_q4_k_experts_and_ep_does_not(moe_gguf: str) -> None:
    config = ModelConfig.create(moe_gguf, "float32")
    with override_tensor_parallel(0, 2), pytest.raises(ValueError, match="whole Q4_K blocks") as e:
        build_model(config, "meta")
    assert str(e.value).endswith("enable_expert_parallel keeps every expert whole")
    with ep_rank(0, 2):
        experts = build_model(config, "meta").model.layers[0].mlp.experts
    assert experts.w2_weight.shape == (3, 256, 144)  # 3 of 6 experts, one Q4_K block a row


@pytest.mark.parametrize("size", [2, 4])
@torch.no_grad()
def test_gguf_ranks_hold_their_experts_blocks_and_sum_to_one_rank(moe_gguf: str, size: int) -> None:
    """With the CPU kernels: each rank's experts are the file's blocks byte for byte, its
    expert bytes are its share, and the partial outputs sum to the one-rank layer's."""
    stored = {
        t.name: torch.from_numpy(np.array(t.data))
        for t in gguf.GGUFReader(moe_gguf).tensors
        if t.name.startswith("blk.0.ffn_") and t.name.endswith("_exps.weight")
    }
    one = loaded_model(moe_gguf, 0, 1).model.layers[0].mlp
    one.experts.quant_method.process_weights_after_loading(one.experts)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(23, 256, generator=generator)
    expected = one(x)
    partials, expert_bytes = [], []
    for rank in range(size):
        experts = loaded_model(moe_gguf, rank, size).model.layers[0].mlp.experts
        local = experts.local_experts
        assert len(local) == len(local_expert_range(size, rank, NUM_EXPERTS))
        assert torch.equal(experts.w2_weight.data, stored["blk.0.ffn_down_exps.weight"][local])
        gate = stored["blk.0.ffn_gate_exps.weight"][local]
        assert torch.equal(experts.w13_weight.data[:, :256], gate)
        expert_bytes.append(experts.w13_weight.nbytes + experts.w2_weight.nbytes)
        experts.quant_method.process_weights_after_loading(experts)
        experts.reduce_results = False
        partials.append(experts(x, one.gate(x)))
    one_bytes = sum(t.nbytes for t in stored.values())
    assert sum(expert_bytes) == one_bytes
    assert expert_bytes[0] == one_bytes * len(local_expert_range(size, 0, NUM_EXPERTS)) // 6
    assert (sum(partials) - expected).abs().max().item() <= 1e-5 * expected.abs().max().item()
