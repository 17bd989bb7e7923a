"""EXAONE 4.0, as transformers' Exaone4ForCausalLM: OLMo 2's post-norm decoder (each block's
output RMS-normed before it joins the residual stream, no norm in front of the blocks;
models/olmo2.py) with Qwen3's per-head q/k RMSNorm. A hybrid config (one that sets
`sliding_window`: the 32B's three sliding layers to one global) attends within the window on
its "sliding_attention" layers and rotates q and k on those only: its global layers use no
position embedding (NoPE). A config without a window rotates every layer (the 1.2B)."""

import torch
from transformers import PretrainedConfig

from pagedllm.layers.layernorm import RMSNorm
from pagedllm.layers.quantization.base_config import QuantizationConfig
from pagedllm.models.config_fields import layer_type
from pagedllm.models.llama import AttentionOptions, LlamaAttention
from pagedllm.models.olmo2 import Olmo2DecoderLayer, Olmo2ForCausalLM
from pagedllm.models.pipeline import layer_index


def rotates(config: PretrainedConfig, layer_idx: int) -> bool:
    """Whether layer `layer_idx` applies the rotary embedding (transformers' rule: a config
    without `sliding_window` rotates every layer, a hybrid one its sliding layers only)."""
    if getattr(config, "sliding_window", None) is None:
        return True
    return layer_type(config, layer_idx) == "sliding_attention"


class Exaone4Attention(LlamaAttention):
    """LlamaAttention with per-head q/k norms, and no rotary embedding on a NoPE layer."""

    def __init__(
        self,
        config: PretrainedConfig,
        options: AttentionOptions,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__(config, options, quant_config, prefix)
        if not rotates(config, layer_index(prefix)):
            self.rotary_emb = None

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        if self.rotary_emb is not None:
            return super().forward(positions, hidden_states)
        qkv = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self._per_head(q, self.q_norm), self._per_head(k, self.k_norm)
        return self.o_proj(self.attn(q, k, v))

    def _per_head(self, x: torch.Tensor, norm: RMSNorm) -> torch.Tensor:
        """x [T, heads * head_dim], each head normed on its own."""
        return norm(x.view(*x.shape[:-1], -1, self.head_dim)).view(x.shape)


class Exaone4DecoderLayer(Olmo2DecoderLayer):
    attention_class = Exaone4Attention


class Exaone4ForCausalLM(Olmo2ForCausalLM):
    decoder_layer = Exaone4DecoderLayer

    @classmethod
    def attention_options(cls, config: PretrainedConfig) -> AttentionOptions:
        bias = bool(getattr(config, "attention_bias", False))
        return AttentionOptions(qkv_bias=bias, o_bias=bias, qk_norm=True)
