"""Qwen2-MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): Qwen2's attention (q/k/v biases,
`qkv_bias`) with sparse blocks in the layers moe_block.is_dense_qwen_moe_layer does not make
dense, as transformers' Qwen2MoeForCausalLM. Each sparse block is Qwen3-MoE's routed experts
(`moe_intermediate_size`, top-k weights renormalized by `norm_topk_prob`) plus a shared
expert every token runs, a SwiGLU MLP of `shared_expert_intermediate_size`, its output
scaled by sigmoid(shared_expert_gate(x)), a [1, hidden] gate.

The shared expert is split over tensor-parallel ranks as a dense MLP (under expert
parallelism too, where only the routed experts are placed whole); its gate, like the
router, is replicated and stays in float under quantization, as vLLM keeps it.
"""

import torch
from torch import nn
from transformers import PretrainedConfig

from pagedllm.layers.linear import ReplicatedLinear
from pagedllm.layers.quantization.base_config import QuantizationConfig
from pagedllm.models.llama import AttentionOptions, LlamaMLP
from pagedllm.models.moe_block import (
    SparseMoeBlock,
    SparseMoeModel,
    is_dense_qwen_moe_layer,
)
from pagedllm.models.qwen2 import Qwen2ForCausalLM


class Qwen2MoeSparseMoeBlock(SparseMoeBlock):
    def __init__(
        self, config: PretrainedConfig, quant_config: QuantizationConfig | None, prefix: str
    ) -> None:
        super().__init__(
            config, config.moe_intermediate_size, config.norm_topk_prob, quant_config, prefix
        )
        self.shared_expert = LlamaMLP(
            config.hidden_size,
            config.shared_expert_intermediate_size,
            config.hidden_act,
            quant_config,
            f"{prefix}.shared_expert",
        )
        self.shared_expert_gate = ReplicatedLinear(
            config.hidden_size, 1, False, None, f"{prefix}.shared_expert_gate"
        )

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """[T, H] -> [T, H]: the routed experts' sum plus the gated shared expert's output."""
        routed = super().forward(hidden_states)
        shared = self.shared_expert(hidden_states)
        gate = torch.sigmoid(self.shared_expert_gate(hidden_states))  # [T, 1]
        return routed + gate * shared


class Qwen2MoeForCausalLM(SparseMoeModel, Qwen2ForCausalLM):
    @classmethod
    def attention_options(cls, config: PretrainedConfig) -> AttentionOptions:
        return AttentionOptions(qkv_bias=getattr(config, "qkv_bias", True))

    def sparse_mlp(
        self, config: PretrainedConfig, quant_config: QuantizationConfig | None, prefix: str
    ) -> nn.Module:
        return Qwen2MoeSparseMoeBlock(config, quant_config, prefix)

    @classmethod
    def has_dense_mlp(cls, config: PretrainedConfig, layer_idx: int) -> bool:
        return is_dense_qwen_moe_layer(config, layer_idx)
