"""pagedllm/models/qwen2_moe.py. References: transformers' Qwen2-MoE, for which layers are
sparse (as Qwen3-MoE's rule) and for the checkpoint it writes (the routed experts as
Qwen3-MoE's, the shared expert's gate/up/down_proj fused as a dense MLP's, the
shared_expert_gate [1, hidden]); its logits: tests/models/test_models_vs_transformers.py."""

from collections.abc import Callable

import pytest
import torch
import transformers

from pagedllm.config import ModelConfig
from pagedllm.layers.quantization.unquantized import UnquantizedLinearMethod
from pagedllm.model_loader.loader import get_model
from pagedllm.models.qwen2_moe import Qwen2MoeForCausalLM, Qwen2MoeSparseMoeBlock
from tests.models.checkpoints import (
    assert_loaded_from,
    empty_model,
    load,
    read_checkpoint,
    save_and_read,
)
from tests.models.tiny_models import tiny_configs


@pytest.mark.parametrize("step, dense_layers", [(1, []), (2, []), (1, [0, 2]), (3, [1])])
def test_sparse_layers_are_transformers(step: int, dense_layers: list[int]) -> None:
    config = tiny_configs()["qwen2-moe"]
    config.num_hidden_layers = 4
    config.layer_types = ["full_attention"] * 4
    config.decoder_sparse_step, config.mlp_only_layers = step, dense_layers
    hf = transformers.AutoModelForCausalLM.from_config(config)
    expected = [type(layer.mlp).__name__ == "Qwen2MoeSparseMoeBlock" for layer in hf.model.layers]
    ours = Qwen2MoeForCausalLM(config)
    got = [isinstance(layer.mlp, Qwen2MoeSparseMoeBlock) for layer in ours.model.layers]
    assert got == expected


def test_shared_expert_and_its_gate_load(tiny_model_path: Callable[[str], str]) -> None:
    """Layer 0 is sparse, layer 1 dense (mlp_only_layers=[1]) in the tiny config."""
    folder = tiny_model_path("qwen2-moe")
    checkpoint = read_checkpoint(folder)
    model = load(empty_model(folder), checkpoint)
    block = model.model.layers[0].mlp
    assert isinstance(block, Qwen2MoeSparseMoeBlock)
    shared = "model.layers.0.mlp.shared_expert."
    gate_up = torch.cat(
        [checkpoint[shared + "gate_proj.weight"], checkpoint[shared + "up_proj.weight"]]
    )
    torch.testing.assert_close(block.shared_expert.gate_up_proj.weight, gate_up, rtol=0, atol=0)
    torch.testing.assert_close(
        block.shared_expert_gate.weight,
        checkpoint["model.layers.0.mlp.shared_expert_gate.weight"],
        rtol=0,
        atol=0,
    )
    assert block.shared_expert_gate.weight.shape == (1, 64)
    assert not block.experts.renormalize  # the tiny config's norm_topk_prob, Qwen1.5-MoE's
    assert_loaded_from(model, checkpoint, skip="layers.0.mlp.")  # the experts: test_qwen3_moe.py


def test_shared_expert_gate_stays_float_under_int8(tiny_model_path: Callable[[str], str]) -> None:
    """As the router: a [1, hidden] scale of the shared expert's output."""
    model = get_model(
        ModelConfig.create(tiny_model_path("qwen2-moe"), "float32", quantization="int8")
    )
    block = model.model.layers[0].mlp
    assert type(block.shared_expert_gate.quant_method) is UnquantizedLinearMethod
    assert block.shared_expert_gate.weight.dtype == torch.float32
    assert block.shared_expert.gate_up_proj.weight.dtype == torch.uint8


@pytest.mark.parametrize("qkv_bias", [True, False])
def test_qkv_biases_as_the_config_says(qkv_bias: bool, tmp_path) -> None:
    """transformers' `qkv_bias` (True in every released config, which predate it): the
    checkpoint has q/k/v biases or none, never an o_proj bias."""
    config = tiny_configs()["qwen2-moe"]
    config.qkv_bias = qkv_bias
    checkpoint = save_and_read(config, str(tmp_path))
    assert ("model.layers.0.self_attn.q_proj.bias" in checkpoint) is qkv_bias
    assert "model.layers.0.self_attn.o_proj.bias" not in checkpoint
    attn = load(empty_model(str(tmp_path)), checkpoint).model.layers[0].self_attn
    assert (attn.qkv_proj.bias is not None) is qkv_bias and attn.o_proj.bias is None
