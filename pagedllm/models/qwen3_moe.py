"""Qwen3-MoE: Qwen3 attention with sparse MoE blocks (router + top-k experts, no shared expert).

Layer i is sparse when it is not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0.
"""

import torch
from torch import nn
from transformers import PretrainedConfig

from pagedllm.layers.fused_moe import FusedMoE
from pagedllm.layers.inference_module import InferenceModule
from pagedllm.layers.linear import ReplicatedLinear
from pagedllm.layers.quantization.base_config import QuantizationConfig
from pagedllm.models.config_fields import num_experts
from pagedllm.models.qwen3 import Qwen3ForCausalLM


class Qwen3MoeSparseMoeBlock(InferenceModule):
    def __init__(
        self, config: PretrainedConfig, quant_config: QuantizationConfig | None, prefix: str
    ) -> None:
        super().__init__()
        self.gate = ReplicatedLinear(
            config.hidden_size, num_experts(config), False, quant_config, f"{prefix}.gate"
        )
        self.experts = FusedMoE(
            num_experts=num_experts(config),
            top_k=config.num_experts_per_tok,
            hidden_size=config.hidden_size,
            intermediate_size=config.moe_intermediate_size,
            renormalize=config.norm_topk_prob,
            quant_config=quant_config,
            prefix=f"{prefix}.experts",
        )

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.experts(hidden_states, self.gate(hidden_states))


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    def make_mlp(
        self,
        config: PretrainedConfig,
        layer_idx: int,
        quant_config: QuantizationConfig | None,
        prefix: str,
    ) -> nn.Module:
        if not self.has_dense_mlp(config, layer_idx):
            return Qwen3MoeSparseMoeBlock(config, quant_config, prefix)
        return super().make_mlp(config, layer_idx, quant_config, prefix)

    @classmethod
    def has_dense_mlp(cls, config: PretrainedConfig, layer_idx: int) -> bool:
        step = getattr(config, "decoder_sparse_step", 1) or 1
        dense_layers = getattr(config, "mlp_only_layers", None) or []
        return not (
            num_experts(config) > 0
            and layer_idx not in dense_layers
            and (layer_idx + 1) % step == 0
        )

    def expert_params_mapping(self) -> list[tuple[str, str, int, str]]:
        return FusedMoE.make_expert_params_mapping(num_experts(self.config))
