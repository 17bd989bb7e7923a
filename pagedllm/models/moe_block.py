"""The sparse MLP of the MoE families: a router and its routed experts, as transformers'
`*SparseMoeBlock`s. Each token's hidden state [H] gives the router's logits over the E
experts ([E, H], replicated on every rank: the same experts must run everywhere); a softmax,
its top k, renormalized to sum to 1 where the family says so; the token's output is the sum
of those k experts' SwiGLU MLPs weighted by them (layers/fused_moe.py).

The families differ only in the experts' intermediate size and in the renormalization
(Mixtral always, the Qwen-MoEs by `norm_topk_prob`); Qwen2-MoE adds a shared expert
(qwen2_moe.py). Their checkpoints name the parts `mlp.gate` and
`mlp.experts.{e}.{gate,up,down}_proj`, or a model's hf_to_pagedllm_mapper renames them so.
A family's model class takes `SparseMoeModel` before its dense base class: it builds each
sparse layer's block (`sparse_mlp`) and names the layers that stay dense.
"""

import torch
from torch import nn
from transformers import PretrainedConfig

from pagedllm.layers.fused_moe import FusedMoE
from pagedllm.layers.inference_module import InferenceModule
from pagedllm.layers.linear import ReplicatedLinear
from pagedllm.layers.quantization.base_config import QuantizationConfig
from pagedllm.models.config_fields import num_experts


class SparseMoeBlock(InferenceModule):
    def __init__(
        self,
        config: PretrainedConfig,
        intermediate_size: int,
        renormalize: bool,
        quant_config: QuantizationConfig | None,
        prefix: str,
    ) -> None:
        """intermediate_size: each expert's; renormalize: whether the top-k routing weights
        are scaled to sum to 1."""
        super().__init__()
        self.gate = ReplicatedLinear(
            config.hidden_size, num_experts(config), False, quant_config, f"{prefix}.gate"
        )
        self.experts = FusedMoE(
            num_experts=num_experts(config),
            top_k=config.num_experts_per_tok,
            hidden_size=config.hidden_size,
            intermediate_size=intermediate_size,
            renormalize=renormalize,
            quant_config=quant_config,
            prefix=f"{prefix}.experts",
        )

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """[T, H] -> [T, H], summed over the tensor-parallel ranks."""
        return self.experts(hidden_states, self.gate(hidden_states))


def is_dense_qwen_moe_layer(config: PretrainedConfig, layer_idx: int) -> bool:
    """The Qwen-MoE rule (Qwen2-MoE, Qwen3-MoE) of which layers have a dense MLP rather than
    a sparse block, as transformers': those in `mlp_only_layers`, those not a multiple of
    `decoder_sparse_step` (counting from 1), and every layer of a config with no experts."""
    step = getattr(config, "decoder_sparse_step", 1) or 1
    dense_layers = getattr(config, "mlp_only_layers", None) or []
    return not (
        num_experts(config) > 0 and layer_idx not in dense_layers and (layer_idx + 1) % step == 0
    )


class SparseMoeModel:
    """A mixin for a LlamaForCausalLM family with sparse MoE blocks: `sparse_mlp` builds a
    layer's block, `has_dense_mlp` names the layers that keep make_mlp's dense MLP (none
    here), and the experts' checkpoint tensors map onto FusedMoE's parameters."""

    def sparse_mlp(
        self, config: PretrainedConfig, quant_config: QuantizationConfig | None, prefix: str
    ) -> nn.Module:
        raise NotImplementedError

    def make_mlp(
        self,
        config: PretrainedConfig,
        layer_idx: int,
        quant_config: QuantizationConfig | None,
        prefix: str,
    ) -> nn.Module:
        if self.has_dense_mlp(config, layer_idx):
            return super().make_mlp(config, layer_idx, quant_config, prefix)
        return self.sparse_mlp(config, quant_config, prefix)

    @classmethod
    def has_dense_mlp(cls, config: PretrainedConfig, layer_idx: int) -> bool:
        return False

    def expert_params_mapping(self) -> list[tuple[str, str, int, str]]:
        return FusedMoE.make_expert_params_mapping(num_experts(self.config))
