"""Mixtral (8x7B, 8x22B): Mistral's attention (its `sliding_window` on every layer where the
config sets one) with a sparse MoE block in every layer, as transformers'
MixtralForCausalLM: a softmax over all `num_local_experts` router logits, the top
`num_experts_per_tok` renormalized to sum to 1, experts of `intermediate_size`.

Checkpoints name the block `block_sparse_moe` and each expert's gate, up and down
projections w1, w3 and w2 (`block_sparse_moe.experts.{e}.w1.weight`); the mapper renames them
to the names the other MoE families use (`mlp.experts.{e}.gate_proj.weight`, the router
`mlp.gate`), which are also the names GGUF files read as (gguf/tensor_names.py), so loading,
quantized plans and expert parallelism's reads go by one set of names.
"""

from torch import nn
from transformers import PretrainedConfig

from pagedllm.layers.quantization.base_config import QuantizationConfig
from pagedllm.models.llama import MistralForCausalLM
from pagedllm.models.moe_block import SparseMoeBlock, SparseMoeModel
from pagedllm.models.weight_loading import WeightsMapper


class MixtralMoE(SparseMoeBlock):
    """vLLM's name: experts of `intermediate_size`, top-k weights always renormalized."""

    def __init__(
        self, config: PretrainedConfig, quant_config: QuantizationConfig | None, prefix: str
    ) -> None:
        super().__init__(config, config.intermediate_size, True, quant_config, prefix)


class MixtralForCausalLM(SparseMoeModel, MistralForCausalLM):
    hf_to_pagedllm_mapper = WeightsMapper(
        orig_to_new_substr={
            ".block_sparse_moe.": ".mlp.",
            ".w1.": ".gate_proj.",
            ".w3.": ".up_proj.",
            ".w2.": ".down_proj.",
        }
    )

    def sparse_mlp(
        self, config: PretrainedConfig, quant_config: QuantizationConfig | None, prefix: str
    ) -> nn.Module:
        return MixtralMoE(config, quant_config, prefix)
