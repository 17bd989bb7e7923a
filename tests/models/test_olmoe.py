"""pagedllm/models/olmoe.py. References: transformers' OlmoeForCausalLM (every layer a
sparse block; q and k normed over whole projections, whose norm weights the checkpoint
holds as [heads * head_dim] and [kv_heads * head_dim]); its logits:
tests/models/test_models_vs_transformers.py."""

from collections.abc import Callable

import pytest
import torch
import transformers

from pagedllm.models.moe_block import SparseMoeBlock
from pagedllm.models.olmo2 import Olmo2Attention
from pagedllm.models.olmoe import OlmoeForCausalLM
from tests.models.checkpoints import assert_loaded_from, empty_model, load, read_checkpoint
from tests.models.tiny_models import tiny_configs


def test_every_layer_is_sparse_with_whole_projection_qk_norms(
    tiny_model_path: Callable[[str], str],
) -> None:
    config = tiny_configs()["olmoe"]
    hf = transformers.AutoModelForCausalLM.from_config(config)
    assert all(type(layer.mlp).__name__ == "OlmoeSparseMoeBlock" for layer in hf.model.layers)
    folder = tiny_model_path("olmoe")
    checkpoint = read_checkpoint(folder)
    model = load(empty_model(folder), checkpoint)
    for i, layer in enumerate(model.model.layers):
        assert isinstance(layer.mlp, SparseMoeBlock) and not layer.mlp.experts.renormalize
        assert isinstance(layer.self_attn, Olmo2Attention)
        k_norm = checkpoint[f"model.layers.{i}.self_attn.k_norm.weight"]
        assert k_norm.shape == (2 * 16,)  # 2 kv heads of 16
        torch.testing.assert_close(layer.self_attn.k_norm.weight, k_norm, rtol=0, atol=0)
    assert_loaded_from(model, checkpoint, skip="mlp.experts.")


def test_clip_qkv_is_refused() -> None:
    config = tiny_configs()["olmoe"]
    config.clip_qkv = 8.0
    with pytest.raises(ValueError, match=r"clips q, k and v to \+-8.0 \(clip_qkv\)"):
        OlmoeForCausalLM(config)
