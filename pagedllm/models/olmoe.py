"""OLMoE (OLMoE-1B-7B): Llama's layout (a norm in front of the attention and of the MLP)
with OLMo 2's attention, q and k RMS-normed over their whole projections before the rotary
embedding (olmo2.py: gathered from the ranks under tensor parallelism), and a sparse MoE
block in every layer, as transformers' OlmoeForCausalLM: experts of `intermediate_size`,
the top-k routing weights renormalized only where `norm_topk_prob` says so (the released
models do not). Checkpoints name the router `mlp.gate` and the experts
`mlp.experts.{e}.{gate,up,down}_proj`, as the Qwen-MoEs do.
"""

from torch import nn
from transformers import PretrainedConfig

from pagedllm.layers.quantization.base_config import QuantizationConfig
from pagedllm.models.llama import AttentionOptions, LlamaDecoderLayer, LlamaForCausalLM
from pagedllm.models.moe_block import SparseMoeBlock, SparseMoeModel
from pagedllm.models.olmo2 import Olmo2Attention


class OlmoeDecoderLayer(LlamaDecoderLayer):
    attention_class = Olmo2Attention


class OlmoeForCausalLM(SparseMoeModel, LlamaForCausalLM):
    decoder_layer = OlmoeDecoderLayer

    def __init__(
        self, config: PretrainedConfig, quant_config: QuantizationConfig | None = None
    ) -> None:
        if getattr(config, "clip_qkv", None) is not None:
            raise ValueError(
                f"this OLMoE config clips q, k and v to +-{config.clip_qkv} (clip_qkv); "
                "pagedllm runs OLMoE without clipping (clip_qkv null, as released)"
            )
        super().__init__(config, quant_config)

    @classmethod
    def attention_options(cls, config: PretrainedConfig) -> AttentionOptions:
        bias = bool(getattr(config, "attention_bias", False))
        return AttentionOptions(qkv_bias=bias, o_bias=bias)

    def sparse_mlp(
        self, config: PretrainedConfig, quant_config: QuantizationConfig | None, prefix: str
    ) -> nn.Module:
        return SparseMoeBlock(
            config, config.intermediate_size, config.norm_topk_prob, quant_config, prefix
        )
