"""pagedllm/models/qwen3.py: Qwen3 is Llama with a per-head RMSNorm on q and k, and biases
only when attention_bias is set. Reference: transformers' Qwen3 checkpoints (q_norm/k_norm
of head_dim weights; q/k/v/o biases with attention_bias), loaded tensor for tensor."""

from collections.abc import Callable
from pathlib import Path

import transformers

from pagedllm.models.llama import AttentionOptions
from pagedllm.models.qwen3 import Qwen3ForCausalLM
from tests.models.checkpoints import (
    assert_loaded_from,
    empty_model,
    load,
    read_checkpoint,
    save_and_read,
)
from tests.models.tiny_models import COMMON, tiny_configs


def test_attention_options_qk_norm_and_biases_by_attention_bias() -> None:
    config = tiny_configs()["qwen3"]
    assert Qwen3ForCausalLM.attention_options(config) == AttentionOptions(qk_norm=True)
    config.attention_bias = True
    assert Qwen3ForCausalLM.attention_options(config) == AttentionOptions(True, True, True)


def test_qk_norms_of_head_dim_load_by_name(tiny_model_path: Callable[[str], str]) -> None:
    """The tiny Qwen3 has head_dim 32, not hidden / heads = 16."""
    folder = tiny_model_path("qwen3")
    checkpoint = read_checkpoint(folder)
    model = load(empty_model(folder), checkpoint)
    attn = model.model.layers[1].self_attn
    assert attn.q_norm.weight.shape == attn.k_norm.weight.shape == (32,)
    assert attn.qkv_proj.bias is None and attn.o_proj.bias is None
    assert_loaded_from(model, checkpoint)


def test_attention_bias_checkpoint_loads_every_bias(tmp_path: Path) -> None:
    config = transformers.Qwen3Config(**COMMON, num_key_value_heads=2, attention_bias=True)
    checkpoint = save_and_read(config, str(tmp_path))
    assert "model.layers.0.self_attn.o_proj.bias" in checkpoint
    model = load(empty_model(str(tmp_path)), checkpoint)
    assert model.model.layers[0].self_attn.o_proj.bias is not None
    assert_loaded_from(model, checkpoint)
