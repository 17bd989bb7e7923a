"""A decoder layer with norms on both sides of each block (Gemma 2 and 3, GLM-4): each
block's output is normed before it joins the residual stream, and the MLP's input is normed
after the add:
h = h + post_attn_norm(attn(input_norm(h))); h = h + post_mlp_norm(mlp(pre_mlp_norm(h))).

Checkpoints name the three norms after the input norm differently (`norm_names`); Llama's
own `post_attention_layernorm`, which LlamaDecoderLayer builds, is one of them."""

import torch
from torch import nn
from transformers import PretrainedConfig

from pagedllm.layers.quantization.base_config import QuantizationConfig
from pagedllm.models.llama import AttentionOptions, LlamaDecoderLayer


class SandwichNormDecoderLayer(LlamaDecoderLayer):
    """Takes and returns (h, residual) whose sum is the residual stream, as a Llama layer;
    the fused add-and-norm of the next norm adds them."""

    norm_names: tuple[str, str, str] = (
        "post_attention_layernorm",
        "pre_feedforward_layernorm",
        "post_feedforward_layernorm",
    )
    """The checkpoint's names of the post-attention, pre-MLP and post-MLP norms (Gemma 2's)."""

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
        for name in self.norm_names:
            if name != "post_attention_layernorm":  # LlamaDecoderLayer's
                setattr(self, name, self.norm_class(size, eps=eps))

    def forward(
        self, positions: torch.Tensor, hidden_states: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        post_attn_norm, pre_mlp_norm, post_mlp_norm = (getattr(self, n) for n in self.norm_names)
        hidden_states = post_attn_norm(self.self_attn(positions, hidden_states))
        hidden_states, residual = pre_mlp_norm(hidden_states, residual)
        return post_mlp_norm(self.mlp(hidden_states)), residual
