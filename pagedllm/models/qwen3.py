"""Qwen3: Llama with per-head RMSNorm on q and k before rotary, no biases by default."""

from transformers import PretrainedConfig

from pagedllm.models.llama import AttentionOptions, LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    @classmethod
    def attention_options(cls, config: PretrainedConfig) -> AttentionOptions:
        bias = bool(getattr(config, "attention_bias", False))
        return AttentionOptions(qkv_bias=bias, o_bias=bias, qk_norm=True)
