"""ERNIE 4.5 (dense, e.g. ERNIE-4.5-0.3B), as transformers' Ernie4_5ForCausalLM: Llama's
decoder whose rotary embedding turns adjacent channel pairs (2i, 2i + 1: GPT-J's style,
`is_neox_style=False`, as vLLM's Ernie4_5 runs it), with `use_bias` putting biases on q, k,
v, o and on the MLP's gate, up and down."""

from transformers import PretrainedConfig

from pagedllm.models.llama import AttentionOptions, LlamaForCausalLM


class Ernie4_5ForCausalLM(LlamaForCausalLM):
    @classmethod
    def attention_options(cls, config: PretrainedConfig) -> AttentionOptions:
        bias = cls.mlp_bias(config)
        return AttentionOptions(qkv_bias=bias, o_bias=bias, is_neox_style=False)

    @classmethod
    def mlp_bias(cls, config: PretrainedConfig) -> bool:
        return bool(getattr(config, "use_bias", False))
