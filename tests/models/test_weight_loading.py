"""pagedllm/models/weight_loading.py on a toy model. Reference: its contract: every checkpoint
tensor lands in the parameter (and shard, and expert) its name maps to, and loading fails
naming each tensor that maps to nothing and each parameter shard the checkpoint did not
fill (tied parameters count as one)."""

import pytest
import torch
from torch import nn

from pagedllm.distributed.parallel_state import override_tensor_parallel, set_expert_parallel
from pagedllm.layers.fused_moe import FusedMoE
from pagedllm.models.weight_loading import WeightsMapper, load_named_weights

STACKED = [("qkv_proj", "q_proj", "q"), ("qkv_proj", "k_proj", "k"), ("qkv_proj", "v_proj", "v")]
NUM_EXPERTS = 2


class StackedLinear(nn.Module):
    """A [3, 2] weight whose row i is shard "q", "k", "v" (i = 0, 1, 2)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(3, 2), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str) -> None:
        param.data["qkv".index(shard_id)].copy_(loaded)


class Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.Module()
        self.attn.qkv_proj = StackedLinear()
        self.mlp = nn.Module()
        self.mlp.experts = FusedMoE(NUM_EXPERTS, 1, hidden_size=2, intermediate_size=1)
        self.embed = nn.Embedding(4, 2)
        self.head = nn.Linear(2, 4, bias=False)
        self.head.weight = self.embed.weight  # tied


def checkpoint() -> dict[str, torch.Tensor]:
    tensors = {
        "attn.q_proj.weight": torch.tensor([1.0, 2.0]),
        "attn.k_proj.weight": torch.tensor([3.0, 4.0]),
        "attn.v_proj.weight": torch.tensor([5.0, 6.0]),
        "embed.weight": torch.arange(8.0).view(4, 2),
    }
    for e in range(NUM_EXPERTS):
        for i, part in enumerate(("gate_proj", "up_proj")):
            tensors[f"mlp.experts.{e}.{part}.weight"] = torch.full((1, 2), 10.0 * e + i)
        tensors[f"mlp.experts.{e}.down_proj.weight"] = torch.full((2, 1), 10.0 * e + 2)
    return tensors


def load(model: nn.Module, tensors: dict[str, torch.Tensor], **kwargs: object) -> None:
    experts = FusedMoE.make_expert_params_mapping(NUM_EXPERTS)
    load_named_weights(model, tensors.items(), STACKED, experts, **kwargs)


def test_every_tensor_lands_in_its_shard_and_expert() -> None:
    model, tensors = Toy(), checkpoint()
    load(model, tensors)
    assert model.attn.qkv_proj.weight.tolist() == [[1, 2], [3, 4], [5, 6]]
    assert model.mlp.experts.w13_weight.tolist() == [[[0, 0], [1, 1]], [[10, 10], [11, 11]]]
    assert model.mlp.experts.w2_weight.tolist() == [[[2], [2]], [[12], [12]]]
    assert torch.equal(model.head.weight, tensors["embed.weight"])


def test_tied_parameter_loads_under_either_name() -> None:
    tensors = checkpoint()
    tensors["head.weight"] = tensors.pop("embed.weight")
    model = Toy()
    load(model, tensors)
    assert torch.equal(model.embed.weight, tensors["head.weight"])


def test_rotary_inv_freq_and_skipped_prefixes_are_ignored() -> None:
    tensors = checkpoint()
    tensors["attn.rotary_emb.inv_freq"] = torch.zeros(1)
    tensors["vision.tower.weight"] = torch.zeros(1)
    load(Toy(), tensors, skip_prefixes=("vision.",))


@pytest.mark.parametrize(
    "missing, named",
    [
        ("attn.v_proj.weight", "attn.qkv_proj.weight['v']"),
        ("mlp.experts.1.up_proj.weight", "mlp.experts.w13_weight['w3', 1]"),
        ("mlp.experts.0.down_proj.weight", "mlp.experts.w2_weight['w2', 0]"),
        ("embed.weight", "embed.weight"),  # once, though head.weight shares it
    ],
)
def test_unfilled_parameter_shard_is_named(missing: str, named: str) -> None:
    tensors = checkpoint()
    del tensors[missing]
    with pytest.raises(ValueError) as info:
        load(Toy(), tensors)
    assert str(info.value) == f"checkpoint has no weights for 1 parameters: {named}"


@pytest.mark.parametrize("rank", [0, 1])
def test_expert_parallel_rank_needs_only_its_own_experts(rank: int) -> None:
    """Rank r of 2 holds expert r: a checkpoint without the other expert (the loader does not
    read it) loads, and one without its own expert is named."""
    with override_tensor_parallel(rank, 2), set_expert_parallel(True):
        model = Toy()
    tensors = {n: t for n, t in checkpoint().items() if f".experts.{1 - rank}." not in n}
    load(model, tensors)
    assert model.mlp.experts.w2_weight.tolist() == [[[10.0 * rank + 2]] * 2]
    del tensors[f"mlp.experts.{rank}.up_proj.weight"]
    with pytest.raises(ValueError) as info:
        load(model, tensors)
    assert str(info.value).endswith(f"1 parameters: mlp.experts.w13_weight['w3', {rank}]")


def test_many_unfilled_parameters_are_counted_and_the_first_eight_named() -> None:
    with pytest.raises(ValueError) as info:
        load(Toy(), {})
    message = str(info.value)
    assert message.startswith("checkpoint has no weights for 10 parameters: ")
    assert message.endswith("mlp.experts.w2_weight['w2', 0] ...")
    assert message.count("weight[") == 8  # of 3 qkv, 4 w13 and 2 w2 shards, and embed


def test_tensor_mapping_to_no_parameter_is_named() -> None:
    tensors = checkpoint()
    tensors["attn.o_proj.weight"] = torch.zeros(2, 2)
    with pytest.raises(ValueError, match="'attn.o_proj.weight' matches no parameter"):
        load(Toy(), tensors)


def test_loader_error_names_the_checkpoint_tensor() -> None:
    tensors = checkpoint()
    tensors["embed.weight"] = torch.zeros(5, 2)
    with pytest.raises(ValueError, match=r"cannot load checkpoint tensor 'embed.weight': .*shape"):
        load(Toy(), tensors)


def test_mapper_renames_substrings_then_prefixes_and_inverts_both() -> None:
    """vLLM's WeightsMapper order: orig_to_new_substr, then orig_to_new_prefix (None drops)."""
    mapper = WeightsMapper(
        orig_to_new_prefix={"language_model.": "", "vision.": None},
        orig_to_new_substr={".block_sparse_moe.": ".mlp.", ".w1.": ".gate_proj."},
    )
    stored = "language_model.layers.0.block_sparse_moe.experts.2.w1.weight"
    assert mapper.map_name(stored) == "layers.0.mlp.experts.2.gate_proj.weight"
    assert mapper.map_name("vision.block_sparse_moe.w1.weight") is None
    assert mapper.checkpoint_names("layers.0.mlp.experts.2.gate_proj.weight") == [
        stored,
        "language_model.layers.0.mlp.experts.2.gate_proj.weight",
        "layers.0.block_sparse_moe.experts.2.w1.weight",
        "layers.0.mlp.experts.2.gate_proj.weight",
    ]
