"""SmolLM3, as transformers' SmolLM3ForCausalLM: Llama's decoder with NoPE layers (no rotary
embedding on the layers whose `no_rope_layers` entry is 0; every fourth layer in SmolLM3-3B,
config_fields.uses_rope) and, where `use_sliding_window` is set, a sliding window on the
layers `layer_types` names "sliding_attention" (config_fields.sliding_window)."""

from pagedllm.models.llama import LlamaForCausalLM


class SmolLM3ForCausalLM(LlamaForCausalLM):
    pass
