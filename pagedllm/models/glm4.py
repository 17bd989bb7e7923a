"""GLM-4 (GLM-4-0414, GLM-Z1), as transformers' Glm4ForCausalLM: Llama with a norm after the
attention and after the MLP, each block's output normed before it joins the residual stream
(models/sandwich_norm.py: Gemma 2's four norms, under GLM's names):
h = h + post_self_attn_norm(attn(input_norm(h)));
h = h + post_mlp_norm(mlp(post_attention_norm(h))).

Attention: q/k/v biases (`attention_bias`), none on o_proj; the rotary embedding turns the
first `partial_rotary_factor` (0.5) of each head, pairing adjacent channels (GPT-J's style,
transformers' interleaved rotate_half). The checkpoints store gate and up as one
`gate_up_proj`, cut at load as Phi-3's (Phi3ForCausalLM.load_weights)."""

from transformers import PretrainedConfig

from pagedllm.models.llama import AttentionOptions
from pagedllm.models.phi3 import Phi3ForCausalLM
from pagedllm.models.sandwich_norm import SandwichNormDecoderLayer


class Glm4DecoderLayer(SandwichNormDecoderLayer):
    norm_names = ("post_self_attn_layernorm", "post_attention_layernorm", "post_mlp_layernorm")


class Glm4ForCausalLM(Phi3ForCausalLM):
    decoder_layer = Glm4DecoderLayer

    @classmethod
    def attention_options(cls, config: PretrainedConfig) -> AttentionOptions:
        bias = bool(getattr(config, "attention_bias", False))
        return AttentionOptions(qkv_bias=bias, is_neox_style=False)
