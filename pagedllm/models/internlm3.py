"""InternLM3 (internlm3-8b-instruct): Llama's decoder. Its checkpoints name their own
modeling code's class, InternLM3ForCausalLM, which transformers runs as LlamaForCausalLM:
InternLM3Config reads config.json's `qkv_bias` as `attention_bias` (q, k, v and o) and
`bias` as `mlp_bias`, and refuses a config where they differ (the remote code puts `bias`
on o_proj, the same value then)."""

from pagedllm.models.llama import LlamaForCausalLM


class InternLM3ForCausalLM(LlamaForCausalLM):
    pass
