"""Granite (IBM Granite 3.x dense): Llama with four constant scales, as transformers'
GraniteForCausalLM: the input embeddings times `embedding_multiplier`, q.k times
`attention_multiplier` (in place of head_dim ** -0.5), each attention and MLP output times
`residual_multiplier` before it joins the residual stream, the logits divided by
`logits_scaling`."""

from transformers import PretrainedConfig

from pagedllm.models.llama import AttentionOptions, LlamaForCausalLM, Multipliers


class GraniteForCausalLM(LlamaForCausalLM):
    @classmethod
    def attention_options(cls, config: PretrainedConfig) -> AttentionOptions:
        bias = bool(getattr(config, "attention_bias", False))
        return AttentionOptions(qkv_bias=bias, o_bias=bias, scale=config.attention_multiplier)

    @classmethod
    def multipliers(cls, config: PretrainedConfig) -> Multipliers:
        return Multipliers(
            embedding=config.embedding_multiplier,
            residual=config.residual_multiplier,
            logits=1.0 / config.logits_scaling,
        )
