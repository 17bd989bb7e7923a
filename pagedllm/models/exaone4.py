"""EXAONE 4.0, as transformers' Exaone4ForCausalLM: OLMo 2's post-norm decoder (each block's
output RMS-normed before it joins the residual stream, no norm in front of the blocks;
models/olmo2.py) with Qwen3's per-head q/k RMSNorm. A hybrid config (one that sets
`sliding_window`: the 32B's three sliding layers to one global) attends within the window on
its "sliding_attention" layers and rotates q and k on those only: its global layers use no
position embedding (NoPE). A config without a window rotates every layer (the 1.2B)."""

from transformers import PretrainedConfig

from pagedllm.layers.rotary_embedding import RotaryEmbedding, get_nope
from pagedllm.models.config_fields import layer_type
from pagedllm.models.llama import AttentionOptions, LlamaAttention
from pagedllm.models.olmo2 import Olmo2DecoderLayer, Olmo2ForCausalLM


def rotates(config: PretrainedConfig, layer_idx: int) -> bool:
    """Whether layer `layer_idx` applies the rotary embedding (transformers' rule: a config
    without `sliding_window` rotates every layer, a hybrid one its sliding layers only)."""
    if getattr(config, "sliding_window", None) is None:
        return True
    return layer_type(config, layer_idx) == "sliding_attention"


class Exaone4Attention(LlamaAttention):
    """LlamaAttention with per-head q/k norms; a NoPE layer's rotary embedding turns by
    angle 0 (get_nope), so its q and k are normed and handed on as a rotated layer's are."""

    def _rope(
        self, config: PretrainedConfig, options: AttentionOptions, layer_idx: int
    ) -> RotaryEmbedding:
        if not rotates(config, layer_idx):
            return get_nope(self.head_dim, config.max_position_embeddings)
        return super()._rope(config, options, layer_idx)


class Exaone4DecoderLayer(Olmo2DecoderLayer):
    attention_class = Exaone4Attention


class Exaone4ForCausalLM(Olmo2ForCausalLM):
    decoder_layer = Exaone4DecoderLayer

    @classmethod
    def attention_options(cls, config: PretrainedConfig) -> AttentionOptions:
        bias = bool(getattr(config, "attention_bias", False))
        return AttentionOptions(qkv_bias=bias, o_bias=bias, qk_norm=True)
