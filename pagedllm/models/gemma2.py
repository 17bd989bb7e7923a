"""Gemma 2 and Gemma 3 (text), as transformers' Gemma2ForCausalLM and Gemma3ForCausalLM:
Gemma (models/gemma.py) with a norm after the attention and around the MLP, each block's
output normed before it joins the residual stream:
h = h + post_attn_norm(attn(input_norm(h))); h = h + post_ff_norm(mlp(pre_ff_norm(h))).

Attention: q.k scaled by query_pre_attn_scalar ** -0.5; layers alternate between a sliding
window and full attention (`layer_types`, config_fields.sliding_window); Gemma 2 caps the
attention scores (attn_logit_softcapping) and the logits (final_logit_softcapping, the
LogitsProcessor's soft_cap). Gemma 3 norms q and k per head (Gemma's 1 + weight) and rotates
its sliding layers at their own theta (`rope_parameters` by layer type)."""

import dataclasses

from transformers import PretrainedConfig

from pagedllm.layers.quantization.base_config import QuantizationConfig
from pagedllm.models.gemma import GemmaDecoderLayer, GemmaForCausalLM
from pagedllm.models.llama import AttentionOptions
from pagedllm.models.sandwich_norm import SandwichNormDecoderLayer
from pagedllm.models.weight_loading import NESTED_LANGUAGE_MODEL


class Gemma2DecoderLayer(SandwichNormDecoderLayer):
    norm_class = GemmaDecoderLayer.norm_class


class Gemma2ForCausalLM(GemmaForCausalLM):
    decoder_layer = Gemma2DecoderLayer

    @classmethod
    def attention_options(cls, config: PretrainedConfig) -> AttentionOptions:
        bias = bool(getattr(config, "attention_bias", False))
        return AttentionOptions(
            qkv_bias=bias,
            o_bias=bias,
            scale=config.query_pre_attn_scalar**-0.5,
            logits_soft_cap=getattr(config, "attn_logit_softcapping", None),
        )


class Gemma3ForCausalLM(Gemma2ForCausalLM):
    """Also the language model of Gemma3ForConditionalGeneration checkpoints, run text-only
    (config.TEXT_ONLY_ARCHITECTURES): their tensors under `language_model.` (or transformers'
    newer `model.language_model.`) are this model's; the vision tower's are not read."""

    hf_to_pagedllm_mapper = NESTED_LANGUAGE_MODEL

    def __init__(
        self, config: PretrainedConfig, quant_config: QuantizationConfig | None = None
    ) -> None:
        if getattr(config, "use_bidirectional_attention", False):
            raise ValueError(
                "this Gemma 3 config attends bidirectionally (an EmbeddingGemma encoder); "
                "pagedllm runs causal decoders only"
            )
        super().__init__(config, quant_config)

    @classmethod
    def attention_options(cls, config: PretrainedConfig) -> AttentionOptions:
        return dataclasses.replace(super().attention_options(config), qk_norm=True)
