"""Seed-OSS (ByteDance's Seed-OSS-36B), as transformers' SeedOssForCausalLM: Llama's decoder
with its biases set apart: `attention_bias` on q, k and v, `attention_out_bias` on o_proj,
`mlp_bias` on the MLP. Its dropouts are training's only."""

from transformers import PretrainedConfig

from pagedllm.models.llama import AttentionOptions, LlamaForCausalLM


class SeedOssForCausalLM(LlamaForCausalLM):
    @classmethod
    def attention_options(cls, config: PretrainedConfig) -> AttentionOptions:
        return AttentionOptions(
            qkv_bias=bool(config.attention_bias), o_bias=bool(config.attention_out_bias)
        )
