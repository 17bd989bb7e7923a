"""Gemma: Llama with Gemma's conventions, as transformers' GemmaForCausalLM. Its RMSNorms
scale by 1 + weight (layers/layernorm.py's GemmaRMSNorm keeps the checkpoint's weight plus
one), its MLP is a GeGLU (the config's `hidden_activation`, gelu_pytorch_tanh), and the input
embeddings are scaled by sqrt(hidden_size) rounded to the model's dtype, as transformers
multiplies by that constant in the embeddings' dtype. The LM head is the embedding."""

import torch
from transformers import PretrainedConfig

from pagedllm.layers.layernorm import GemmaRMSNorm
from pagedllm.models.llama import LlamaDecoderLayer, LlamaForCausalLM, Multipliers


class GemmaDecoderLayer(LlamaDecoderLayer):
    norm_class = GemmaRMSNorm


class GemmaForCausalLM(LlamaForCausalLM):
    decoder_layer = GemmaDecoderLayer

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
