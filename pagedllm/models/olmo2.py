"""OLMo 2: Llama with its norms moved, as transformers' Olmo2ForCausalLM. q and k are
RMS-normed over their whole projections (all heads at once) before the rotary embedding,
and each block's output is normed before it joins the residual stream, with no norm in
front of the blocks: h = h + norm(attn(h)); h = h + norm(mlp(h)).

Under tensor parallelism a rank holds some heads of q and k; the norm needs all of them,
so q and k are gathered from the ranks, normed and cut back (as vLLM does).

OLMo 3 (Olmo3ForCausalLM) is OLMo 2 with sliding-window layers among the global ones
(`layer_types`, three of every four in its configs), each layer type rotated by its own
`rope_parameters` (the global layers' YaRN scaling, the sliding ones' unscaled): what
LlamaAttention reads per layer (config_fields.sliding_window, rope_parameters)."""

import torch
from torch import nn
from transformers import PretrainedConfig

from pagedllm import _custom_ops as ops
from pagedllm.distributed import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
)
from pagedllm.distributed.communication import tensor_model_parallel_all_gather
from pagedllm.layers.layernorm import RMSNorm
from pagedllm.layers.quantization.base_config import QuantizationConfig
from pagedllm.models.llama import (
    AttentionOptions,
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
)


class Olmo2Attention(LlamaAttention):
    def __init__(
        self,
        config: PretrainedConfig,
        options: AttentionOptions,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
        norm_class: type[RMSNorm] = RMSNorm,
    ) -> None:
        """norm_class: the q/k norms' (LlamaAttention's signature; the model's RMSNorm)."""
        super().__init__(config, options, quant_config, prefix)
        self.tp_size = get_tensor_model_parallel_world_size()
        self.tp_rank = get_tensor_model_parallel_rank()
        if self.tp_size > 1 and self.num_kv_heads * self.tp_size != (
            getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        ):
            raise ValueError(
                f"k is normed over all kv heads: tensor_parallel_size {self.tp_size} must "
                f"divide num_key_value_heads {config.num_key_value_heads} (no replicated kv heads)"
            )
        self.q_norm = norm_class(self.q_size * self.tp_size, eps=config.rms_norm_eps)
        self.k_norm = norm_class(self.kv_size * self.tp_size, eps=config.rms_norm_eps)

    def _normed(self, x: torch.Tensor, norm: RMSNorm, size: int) -> torch.Tensor:
        if self.tp_size == 1:
            return norm(x)
        whole = norm(tensor_model_parallel_all_gather(x.contiguous()))
        return whole.narrow(-1, self.tp_rank * size, size).contiguous()

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = self._normed(q, self.q_norm, self.q_size)
        k = self._normed(k, self.k_norm, self.kv_size)
        q, k = self.rotary_emb(positions, q, k)
        return self.o_proj(self.attn(q, k, v))


class Olmo2DecoderLayer(LlamaDecoderLayer):
    """Takes and returns (h, residual) whose sum is the residual stream, as a Llama layer:
    the model's final norm adds them."""

    attention_class: type[LlamaAttention] = Olmo2Attention
    """The class of the layer's attention (EXAONE 4 norms q and k per head)."""

    def __init__(
        self,
        config: PretrainedConfig,
        options: AttentionOptions,
        mlp: nn.Module,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
        residual_multiplier: float = 1.0,
    ) -> None:
        nn.Module.__init__(self)
        self.self_attn = self.attention_class(config, options, quant_config, f"{prefix}.self_attn")
        self.mlp = mlp
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_feedforward_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(
        self, positions: torch.Tensor, hidden_states: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        stream = hidden_states if residual is None else ops.add(residual, hidden_states)
        attn = self.post_attention_layernorm(self.self_attn(positions, stream))
        stream = ops.add(stream, attn)
        return self.post_feedforward_layernorm(self.mlp(stream)), stream


class Olmo2ForCausalLM(LlamaForCausalLM):
    decoder_layer = Olmo2DecoderLayer

    @classmethod
    def attention_options(cls, config: PretrainedConfig) -> AttentionOptions:
        bias = bool(getattr(config, "attention_bias", False))
        return AttentionOptions(qkv_bias=bias, o_bias=bias)


class Olmo3ForCausalLM(Olmo2ForCausalLM):
    """OLMo 3: OLMo 2's decoder; its windows and per-type rotations come from the config."""
