"""Granite MoE (IBM Granite 3.0/3.1 1B-A400M, 3B-A800M): Granite's four scales
(granite.py) with a sparse MoE block in every layer, as transformers'
GraniteMoeForCausalLM: the top `num_experts_per_tok` router logits softmaxed among
themselves (the same weights as a softmax over all experts renormalized over the top k),
experts of `intermediate_size`.

Checkpoints hold each layer's experts fused: `block_sparse_moe.input_linear.weight`
[E, 2 I, H] (each expert's gate rows, then its up rows), `output_linear.weight` [E, H, I]
(its down projection), and the router as `router.layer.weight` [E, H]. The mapper renames
the block to `mlp` and the router to `mlp.gate`; load_weights cuts the fused tensors into
each expert's gate_proj, up_proj and down_proj, as vLLM's granitemoe.py does, so FusedMoE
takes its usual per-expert loads (a rank's rows of each, or its whole experts).
"""

from collections.abc import Iterable, Iterator

import torch
from torch import nn
from transformers import PretrainedConfig

from pagedllm.layers.quantization.base_config import QuantizationConfig
from pagedllm.models.granite import GraniteForCausalLM
from pagedllm.models.moe_block import SparseMoeBlock, SparseMoeModel
from pagedllm.models.weight_loading import WeightsMapper


def per_expert_weights(
    weights: Iterable[tuple[str, torch.Tensor]],
) -> Iterator[tuple[str, torch.Tensor]]:
    """`mlp.input_linear.weight` [E, 2 I, H] and `mlp.output_linear.weight` [E, H, I] as
    `mlp.experts.{e}.gate_proj` / `up_proj` [I, H] and `down_proj` [H, I]; other tensors
    unchanged."""
    for name, tensor in weights:
        if name.endswith(".mlp.input_linear.weight"):
            prefix = name.removesuffix("input_linear.weight") + "experts"
            for e, gate_up in enumerate(tensor):
                gate, up = gate_up.chunk(2, dim=0)
                yield f"{prefix}.{e}.gate_proj.weight", gate
                yield f"{prefix}.{e}.up_proj.weight", up
        elif name.endswith(".mlp.output_linear.weight"):
            prefix = name.removesuffix("output_linear.weight") + "experts"
            for e, down in enumerate(tensor):
                yield f"{prefix}.{e}.down_proj.weight", down
        else:
            yield name, tensor


class GraniteMoeForCausalLM(SparseMoeModel, GraniteForCausalLM):
    hf_to_pagedllm_mapper = WeightsMapper(
        orig_to_new_substr={".block_sparse_moe.": ".mlp.", ".router.layer.": ".gate."}
    )

    def sparse_mlp(
        self, config: PretrainedConfig, quant_config: QuantizationConfig | None, prefix: str
    ) -> nn.Module:
        return SparseMoeBlock(config, config.intermediate_size, True, quant_config, prefix)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(per_expert_weights(weights))
