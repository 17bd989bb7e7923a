"""Qwen2: Llama with biases on q/k/v (not on o_proj)."""

from transformers import PretrainedConfig

from pagedllm.models.llama import AttentionOptions, LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    @classmethod
    def attention_options(cls, config: PretrainedConfig) -> AttentionOptions:
        return AttentionOptions(qkv_bias=True)
