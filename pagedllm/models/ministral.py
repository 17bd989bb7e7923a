"""Ministral and Ministral 3, as transformers' MinistralForCausalLM and Ministral3ForCausalLM:
Mistral's decoder (Llama's, without biases).

Ministral (Ministral-8B) windows the layers its `layer_types` name "sliding_attention"
(config_fields.sliding_window). Ministral 3 rotates with YaRN (layers/rotary_embedding.py)
and scales each rotated query by Llama 4's attention temperature, 1 + beta * ln(1 +
floor(position / original)), beta and original being its `rope_parameters`'
`llama_4_scaling_beta` and `original_max_position_embeddings`: 1 within the original
context, so an engine whose max_model_len is within it (Ministral 3's 16384) leaves it out.
Past there the scale is a torch op, not a kernel launch, so on a CPU its decode steps run
eagerly rather than replay (executor/cpu_graph.py). Ministral 3 ships as
`Mistral3ForConditionalGeneration` checkpoints, a vision tower beside the language model:
pagedllm runs the language model alone (config.TEXT_ONLY_ARCHITECTURES), its names mapped
as MistralForCausalLM's.
"""

import dataclasses

from transformers import PretrainedConfig

from pagedllm.layers.rotary_embedding import served_max_model_len
from pagedllm.models.llama import AttentionOptions, MistralForCausalLM


class MinistralForCausalLM(MistralForCausalLM):
    pass


class Ministral3ForCausalLM(MistralForCausalLM):
    @classmethod
    def attention_options(cls, config: PretrainedConfig) -> AttentionOptions:
        options = super().attention_options(config)
        rope = getattr(config, "rope_parameters", None) or {}
        beta = rope.get("llama_4_scaling_beta")
        if not beta:
            return options
        original = rope.get("original_max_position_embeddings")
        if not original:
            raise ValueError(
                f"rope_parameters' llama_4_scaling_beta {beta} scales queries past "
                "original_max_position_embeddings, which rope_parameters does not give"
            )
        served = served_max_model_len()
        if served is not None and served <= original:  # every position's scale is 1
            return options
        return dataclasses.replace(options, llama_4_scaling=(float(beta), int(original)))
