"""pagedllm/models/mixtral.py. References: the checkpoint transformers writes for Mixtral
(`block_sparse_moe.gate`, `block_sparse_moe.experts.{e}.w1/w3/w2`, as the released ones
name them), loaded into each expert's fused w13 = [w1; w3] and w2 and the router; and
transformers' MixtralForCausalLM, every layer of which is a sparse block (the logits:
tests/models/test_models_vs_transformers.py)."""

from collections.abc import Callable

import pytest
import torch
import transformers

from pagedllm.models.mixtral import MixtralForCausalLM, MixtralMoE
from tests.models.checkpoints import assert_loaded_from, empty_model, load, read_checkpoint
from tests.models.tiny_models import tiny_configs


def model_names(model: MixtralForCausalLM, checkpoint: dict) -> dict[str, torch.Tensor]:
    """The checkpoint under the model's names, as the loader hands it to load_weights."""
    return {model.hf_to_pagedllm_mapper.map_name(name): t for name, t in checkpoint.items()}


def test_experts_load_from_w1_w3_w2(tiny_model_path: Callable[[str], str]) -> None:
    folder = tiny_model_path("mixtral")
    checkpoint = read_checkpoint(folder)
    assert "model.layers.1.block_sparse_moe.experts.7.w3.weight" in checkpoint
    model = empty_model(folder)
    load(model, model_names(model, checkpoint))
    for i, layer in enumerate(model.model.layers):
        assert isinstance(layer.mlp, MixtralMoE)
        block = f"model.layers.{i}.block_sparse_moe."
        torch.testing.assert_close(
            layer.mlp.gate.weight, checkpoint[block + "gate.weight"], rtol=0, atol=0
        )
        for e in range(8):
            expert = f"{block}experts.{e}."
            w13 = torch.cat([checkpoint[expert + "w1.weight"], checkpoint[expert + "w3.weight"]])
            torch.testing.assert_close(layer.mlp.experts.w13_weight[e], w13, rtol=0, atol=0)
            torch.testing.assert_close(
                layer.mlp.experts.w2_weight[e], checkpoint[expert + "w2.weight"], rtol=0, atol=0
            )
    assert_loaded_from(model, checkpoint, skip=".mlp.")  # attention, norms, embedding, head


def test_checkpoint_names_of_the_models_names() -> None:
    """The inverse the quantized checkpoints' targets are matched by (a GPTQ Mixtral's
    `block_sparse_moe.experts.0.w1`): the released checkpoints' name first, then the
    model's own, which no rename changes."""
    mapper = MixtralForCausalLM.hf_to_pagedllm_mapper
    for name, stored in [
        ("model.layers.3.mlp.experts.5.down_proj.weight", "block_sparse_moe.experts.5.w2"),
        ("model.layers.0.mlp.gate.weight", "block_sparse_moe.gate"),
    ]:
        layer = name[: len("model.layers.0.")]
        assert mapper.checkpoint_names(name) == [f"{layer}{stored}.weight", name]
    attention = "model.layers.0.self_attn.q_proj.weight"
    assert mapper.checkpoint_names(attention) == [attention]


def test_every_layer_is_sparse_and_only_attention_takes_lora() -> None:
    config = tiny_configs()["mixtral"]
    hf = transformers.AutoModelForCausalLM.from_config(config)
    assert all(type(layer.mlp).__name__ == "MixtralSparseMoeBlock" for layer in hf.model.layers)
    shapes = MixtralForCausalLM.lora_target_shapes(config)
    assert {name.rpartition(".")[2] for name in shapes} == {"q_proj", "k_proj", "v_proj", "o_proj"}


def test_missing_expert_is_named_by_the_models_name(tiny_model_path: Callable[[str], str]) -> None:
    folder = tiny_model_path("mixtral")
    checkpoint = read_checkpoint(folder)
    del checkpoint["model.layers.1.block_sparse_moe.experts.6.w3.weight"]
    model = empty_model(folder)
    with pytest.raises(ValueError, match="no weights for 1 parameters") as info:
        load(model, model_names(model, checkpoint))
    assert str(info.value).endswith("model.layers.1.mlp.experts.w13_weight['w3', 6]")
