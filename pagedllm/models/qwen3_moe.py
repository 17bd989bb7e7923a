"""Qwen3-MoE: Qwen3 attention with sparse MoE blocks (router + top-k experts, no shared
expert) in the layers moe_block.is_dense_qwen_moe_layer does not make dense."""

from torch import nn
from transformers import PretrainedConfig

from pagedllm.layers.quantization.base_config import QuantizationConfig
from pagedllm.models.moe_block import (
    SparseMoeBlock,
    SparseMoeModel,
    is_dense_qwen_moe_layer,
)
from pagedllm.models.qwen3 import Qwen3ForCausalLM


class Qwen3MoeSparseMoeBlock(SparseMoeBlock):
    """Experts of `moe_intermediate_size`, top-k weights renormalized by `norm_topk_prob`."""

    def __init__(
        self, config: PretrainedConfig, quant_config: QuantizationConfig | None, prefix: str
    ) -> None:
        super().__init__(
            config, config.moe_intermediate_size, config.norm_topk_prob, quant_config, prefix
        )


class Qwen3MoeForCausalLM(SparseMoeModel, Qwen3ForCausalLM):
    def sparse_mlp(
        self, config: PretrainedConfig, quant_config: QuantizationConfig | None, prefix: str
    ) -> nn.Module:
        return Qwen3MoeSparseMoeBlock(config, quant_config, prefix)

    @classmethod
    def has_dense_mlp(cls, config: PretrainedConfig, layer_idx: int) -> bool:
        return is_dense_qwen_moe_layer(config, layer_idx)
