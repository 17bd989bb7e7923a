"""GLM-4 (GLM-4-0414, GLM-Z1), as transformers' Glm4ForCausalLM: Llama with a norm after the
attention and after the MLP, each block's output normed before it joins the residual stream
(Gemma 2's four norms, under GLM's names):
h = h + post_self_attn_norm(attn(input_norm(h)));
h = h + post_mlp_norm(mlp(post_attention_norm(h))).

Attention: q/k/v biases (`attention_bias`), none on o_proj; the rotary embedding turns the
first `partial_rotary_factor` (0.5) of each head, pairing adjacent channels (GPT-J's style,
transformers' interleaved rotate_half). The checkpoints store gate and up as one
`gate_up_proj`, cut at load as Phi-3's (Phi3ForCausalLM.load_weights)."""

import torch
from torch import nn
from transformers import PretrainedConfig

from pagedllm.layers.quantization.base_config import QuantizationConfig
from pagedllm.models.llama import AttentionOptions, LlamaDecoderLayer
from pagedllm.models.phi3 import Phi3ForCausalLM


class Glm4DecoderLayer(LlamaDecoderLayer):
    """Takes and returns (h, residual) whose sum is the residual stream, as a Llama layer;
    the fused add-and-norm of the next norm adds them."""

    def __init__(
        self,
        config: PretrainedConfig,
        options: AttentionOptions,
        mlp: nn.Module,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
        residual_multiplier: float = 1.0,
    ) -> None:
        super().__init__(config, options, mlp, quant_config, prefix)
        size, eps = config.hidden_size, config.rms_norm_eps
        self.post_self_attn_layernorm = self.norm_class(size, eps=eps)
        self.post_mlp_layernorm = self.norm_class(size, eps=eps)

    def forward(
        self, positions: torch.Tensor, hidden_states: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.post_self_attn_layernorm(self.self_attn(positions, hidden_states))
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.post_mlp_layernorm(self.mlp(hidden_states)), residual


class Glm4ForCausalLM(Phi3ForCausalLM):
    decoder_layer = Glm4DecoderLayer

    @classmethod
    def attention_options(cls, config: PretrainedConfig) -> AttentionOptions:
        bias = bool(getattr(config, "attention_bias", False))
        return AttentionOptions(qkv_bias=bias, is_neox_style=False)
