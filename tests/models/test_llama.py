"""pagedllm/models/llama.py: how LlamaForCausalLM maps a transformers checkpoint onto its
fused parameters (packed modules: q/k/v -> qkv_proj, gate/up -> gate_up_proj) and its
options. Reference: the checkpoint transformers' save_pretrained writes: each fused
parameter is the concatenation of its parts, every other one the tensor of its name."""

from collections.abc import Callable

import pytest
import torch
import transformers

from pagedllm.models.llama import (
    AttentionOptions,
    LlamaForCausalLM,
    LlamaMLP,
    llama_4_attn_scale,
)
from tests.models.checkpoints import (
    assert_loaded_from,
    empty_model,
    load,
    read_checkpoint,
    save_and_read,
)
from tests.models.tiny_models import COMMON, tiny_configs


@pytest.mark.parametrize("name", ["llama-gqa-llama3", "llama-gqa4", "mistral"])
def test_fused_parameters_are_the_concatenated_checkpoint_tensors(
    name: str, tiny_model_path: Callable[[str], str]
) -> None:
    folder = tiny_model_path(name)
    checkpoint = read_checkpoint(folder)
    assert_loaded_from(load(empty_model(folder), checkpoint), checkpoint)


def test_attention_bias_adds_qkv_and_o_biases(tmp_path) -> None:
    """Llama's attention_bias puts a bias on q/k/v and on o_proj (transformers' LlamaAttention)."""
    config = transformers.LlamaConfig(**COMMON, num_key_value_heads=2, attention_bias=True)
    checkpoint = save_and_read(config, str(tmp_path))
    assert "model.layers.0.self_attn.o_proj.bias" in checkpoint
    model = load(empty_model(str(tmp_path)), checkpoint)
    attn = model.model.layers[0].self_attn
    assert attn.qkv_proj.bias is not None and attn.o_proj.bias is not None
    assert_loaded_from(model, checkpoint)


def test_tied_embeddings_share_one_tensor_and_skip_the_checkpoints_lm_head(
    tiny_model_path: Callable[[str], str],
) -> None:
    folder = tiny_model_path("llama-tied-mqa")
    checkpoint = read_checkpoint(folder)
    checkpoint["lm_head.weight"] = torch.full_like(checkpoint["model.embed_tokens.weight"], 7.0)
    model = load(empty_model(folder), checkpoint)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    torch.testing.assert_close(
        model.lm_head.weight, checkpoint["model.embed_tokens.weight"], rtol=0, atol=0
    )


@pytest.mark.parametrize(
    "missing, named",
    [
        ("model.layers.1.self_attn.k_proj.weight", "model.layers.1.self_attn.qkv_proj.weight['k']"),
        ("model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.gate_up_proj.weight[1]"),
        ("model.norm.weight", "model.norm.weight"),
        ("lm_head.weight", "lm_head.weight"),  # untied: the head is a weight of its own
    ],
)
def test_missing_checkpoint_tensor_is_named(
    missing: str, named: str, tiny_model_path: Callable[[str], str]
) -> None:
    folder = tiny_model_path("llama-gqa4")
    checkpoint = read_checkpoint(folder)
    del checkpoint[missing]
    with pytest.raises(ValueError, match="checkpoint has no weights for 1 parameters") as info:
        load(empty_model(folder), checkpoint)
    assert str(info.value).endswith(named)


def test_unexpected_checkpoint_tensor_is_named(tiny_model_path: Callable[[str], str]) -> None:
    folder = tiny_model_path("llama-gqa4")
    checkpoint = read_checkpoint(folder)
    checkpoint["model.layers.0.self_attn.g_proj.weight"] = torch.zeros(2)
    with pytest.raises(ValueError, match="'model.layers.0.self_attn.g_proj.weight' matches no"):
        load(empty_model(folder), checkpoint)


def test_attention_options_follow_attention_bias() -> None:
    config = tiny_configs()["llama-gqa4"]
    assert LlamaForCausalLM.attention_options(config) == AttentionOptions()
    config.attention_bias = True
    assert LlamaForCausalLM.attention_options(config) == AttentionOptions(True, True, False)


def test_mlp_refuses_an_unknown_activation() -> None:
    with pytest.raises(ValueError, match="hidden_act 'relu' is not supported; supported: silu"):
        LlamaMLP(64, 96, "relu")


def test_llama_4_attn_scale_is_transformers() -> None:
    """Reference: transformers' get_llama_4_attn_scale (Ministral 3), float32, bit for bit."""
    from transformers.models.ministral3.modeling_ministral3 import get_llama_4_attn_scale

    positions = torch.tensor([0, 7, 8, 15, 16, 100, 4095, 70000])
    expected = get_llama_4_attn_scale(positions[None], 0.1, 8)[0, 0]  # [T, 1]
    assert torch.equal(llama_4_attn_scale(positions, 0.1, 8), expected)
