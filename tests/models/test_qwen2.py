"""pagedllm/models/qwen2.py: Qwen2 is Llama with biases on q/k/v, not on o_proj.
Reference: transformers' Qwen2 checkpoint (q/k/v biases saved, no o_proj bias), whose
biases load into qkv_proj's as their concatenation."""

from collections.abc import Callable

from pagedllm.models.llama import AttentionOptions
from pagedllm.models.qwen2 import Qwen2ForCausalLM
from tests.models.checkpoints import assert_loaded_from, empty_model, load, read_checkpoint
from tests.models.tiny_models import tiny_configs


def test_attention_options_are_qkv_bias_only() -> None:
    options = Qwen2ForCausalLM.attention_options(tiny_configs()["qwen2"])
    assert options == AttentionOptions(qkv_bias=True, o_bias=False, qk_norm=False)


def test_qkv_biases_load_as_their_concatenation(tiny_model_path: Callable[[str], str]) -> None:
    folder = tiny_model_path("qwen2")
    checkpoint = read_checkpoint(folder)
    assert "model.layers.0.self_attn.q_proj.bias" in checkpoint
    assert "model.layers.0.self_attn.o_proj.bias" not in checkpoint
    model = load(empty_model(folder), checkpoint)
    assert isinstance(model, Qwen2ForCausalLM)
    attn = model.model.layers[0].self_attn
    assert attn.qkv_proj.bias is not None and attn.o_proj.bias is None
    assert model.lm_head.weight is model.model.embed_tokens.weight  # the tiny qwen2 is tied
    assert_loaded_from(model, checkpoint)
