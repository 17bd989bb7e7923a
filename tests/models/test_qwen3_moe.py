"""pagedllm/models/qwen3_moe.py. References: transformers' Qwen3-MoE, for which layers are
sparse (not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0) and for the
checkpoint it writes (experts.{e}.{gate,up,down}_proj, loaded into the fused w13 = [gate;
up] and w2 of each expert, the router as mlp.gate)."""

from collections.abc import Callable

import pytest
import torch
import transformers

from pagedllm.models.qwen3_moe import Qwen3MoeForCausalLM, Qwen3MoeSparseMoeBlock
from tests.models.checkpoints import assert_loaded_from, empty_model, load, read_checkpoint
from tests.models.tiny_models import tiny_configs


@pytest.mark.parametrize(
    "step, dense_layers, num_experts",
    [(1, [], 8), (1, [1], 8), (2, [], 8), (2, [1], 8), (3, [0, 3], 8), (1, [], 0)],
)
def test_sparse_layers_are_transformers(
    step: int, dense_layers: list[int], num_experts: int
) -> None:
    config = tiny_configs()["qwen3-moe"]
    config.num_hidden_layers = 4
    config.decoder_sparse_step, config.mlp_only_layers = step, dense_layers
    config.num_experts = num_experts
    hf = transformers.AutoModelForCausalLM.from_config(config)
    expected = [type(layer.mlp).__name__ == "Qwen3MoeSparseMoeBlock" for layer in hf.model.layers]
    ours = Qwen3MoeForCausalLM(config)
    assert [isinstance(layer.mlp, Qwen3MoeSparseMoeBlock) for layer in ours.model.layers] == (
        expected
    )


def test_experts_load_into_fused_w13_and_w2(tiny_model_path: Callable[[str], str]) -> None:
    """Layer 0 is sparse, layer 1 dense (mlp_only_layers=[1]) in the tiny config."""
    folder = tiny_model_path("qwen3-moe")
    checkpoint = read_checkpoint(folder)
    model = load(empty_model(folder), checkpoint)
    moe = model.model.layers[0].mlp
    assert isinstance(moe, Qwen3MoeSparseMoeBlock)
    for e in range(8):
        expert = f"model.layers.0.mlp.experts.{e}."
        gate_up = torch.cat(
            [checkpoint[expert + "gate_proj.weight"], checkpoint[expert + "up_proj.weight"]]
        )
        torch.testing.assert_close(moe.experts.w13_weight[e], gate_up, rtol=0, atol=0)
        torch.testing.assert_close(
            moe.experts.w2_weight[e], checkpoint[expert + "down_proj.weight"], rtol=0, atol=0
        )
    assert_loaded_from(model, checkpoint, skip="mlp.experts.")  # router, attention, dense MLP


def test_missing_expert_weight_is_named_with_shard_and_expert(
    tiny_model_path: Callable[[str], str],
) -> None:
    folder = tiny_model_path("qwen3-moe")
    checkpoint = read_checkpoint(folder)
    del checkpoint["model.layers.0.mlp.experts.5.up_proj.weight"]
    with pytest.raises(ValueError, match="no weights for 1 parameters") as info:
        load(empty_model(folder), checkpoint)
    assert str(info.value).endswith("model.layers.0.mlp.experts.w13_weight['w3', 5]")
