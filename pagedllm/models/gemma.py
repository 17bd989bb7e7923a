"""Gemma: Llama with Gemma's conventions, as transformers' GemmaForCausalLM. Its RMSNorms
scale by 1 + weight (layers/layernorm.py's GemmaRMSNorm keeps the checkpoint's weight plus
one), its MLP is a GeGLU (the config's `hidden_activation`, gelu_pytorch_tanh), and the input
embeddings are scaled by sqrt(hidden_size) rounded to the model's dtype, as transformers
multiplies by that constant in the embeddings' dtype. The LM head is the embedding."""

import torch
from torch import nn
from transformers import PretrainedConfig

from pagedllm.layers.layernorm import GemmaRMSNorm
from pagedllm.layers.quantization.base_config import QuantizationConfig
from pagedllm.models.llama import (
    AttentionOptions,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    Multipliers,
)
from pagedllm.models.pipeline import PPMissingLayer


class GemmaDecoderLayer(LlamaDecoderLayer):
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
        self.input_layernorm = GemmaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = GemmaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)


class GemmaForCausalLM(LlamaForCausalLM):
    decoder_layer = GemmaDecoderLayer

    def __init__(
        self, config: PretrainedConfig, quant_config: QuantizationConfig | None = None
    ) -> None:
        super().__init__(config, quant_config)
        if not isinstance(self.model.norm, PPMissingLayer):
            self.model.norm = GemmaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    @classmethod
    def multipliers(cls, config: PretrainedConfig) -> Multipliers:
        normalizer = torch.tensor(
            config.hidden_size**0.5, dtype=torch.get_default_dtype(), device="cpu"
        )
        return Multipliers(embedding=float(normalizer))

    @classmethod
    def hidden_act(cls, config: PretrainedConfig) -> str:
        """`hidden_activation`; where older configs leave it unset, the tanh GELU their
        models were trained with (transformers' and vLLM's rule)."""
        return getattr(config, "hidden_activation", None) or "gelu_pytorch_tanh"
