"""Weights in the model's float dtype: pagedllm's path before quantization, and the
reference every quantized method is tested against."""

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from pagedllm._custom_ops import (
    MoEKernel,
    fused_experts,
    linear,
    prepack_linear_weight,
    select_linear_kernel,
    select_moe_kernel,
)
from pagedllm.layers.quantization.base_config import (
    EmbeddingMethodBase,
    FusedMoEMethodBase,
    LayerKind,
    LinearMethodBase,
    new_weight,
)


class UnquantizedLinearMethod(LinearMethodBase):
    """W [out, in] in params_dtype, applied by _custom_ops.linear (skinny_gemm or AMX tiles
    for every row count on CPUs, F.linear elsewhere)."""

    def create_weights(
        self,
        layer: nn.Module,
        input_size_per_partition: int,
        output_partition_sizes: list[int],
        input_size: int,
        output_size: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs: Any,
    ) -> None:
        shape = (sum(output_partition_sizes), input_size_per_partition)
        layer.weight = new_weight(shape, params_dtype, **extra_weight_attrs)
        layer.linear_kernel = None  # chosen after loading

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """The weight takes the layout its CPU kernel streams fastest (prepack_linear_weight):
        AMX tiles, or skinny_gemm's packed order where its best build reads one; the layer
        keeps the kernel that multiplies it (select_linear_kernel)."""
        packed = prepack_linear_weight(layer.weight)
        if packed is not layer.weight:
            layer.weight = nn.Parameter(packed, requires_grad=False)
        layer.linear_kernel = select_linear_kernel(layer.weight)

    def apply(
        self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        return linear(x, layer.weight, bias, kernel=layer.linear_kernel)


class UnquantizedEmbeddingMethod(UnquantizedLinearMethod, EmbeddingMethodBase):
    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """An LM head takes its kernel's layout as a linear layer does (prepack_linear_weight);
        an embedding keeps its rows to look up. A tied LM head keeps the embedding's rows as
        its weight and holds the packed copy as packed_weight (vocab x hidden more bytes,
        counted in the resident size), which linear() multiplies for every step. An untied
        head keeps only the packed weight."""
        if layer.quant_kind is not LayerKind.LM_HEAD:
            return
        packed = prepack_linear_weight(layer.weight)
        if packed is not layer.weight:
            packed = nn.Parameter(packed, requires_grad=False)
            if layer.tied:
                layer.packed_weight = packed
            else:
                layer.weight = packed
        layer.linear_kernel = select_linear_kernel(packed)

    def apply(
        self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        packed = getattr(layer, "packed_weight", None)
        return linear(x, layer.weight, bias, packed, kernel=layer.linear_kernel)

    def embedding(self, layer: nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, layer.weight)


class UnquantizedFusedMoEMethod(FusedMoEMethodBase):
    """Float experts, run by the kernel process_weights_after_loading picks (`moe_kernel`):
    vLLM's Triton fused_experts on GPUs, the grouped per-expert loop on the tuned CPU
    linear kernels elsewhere."""

    def create_weights(
        self,
        layer: nn.Module,
        num_experts: int,
        hidden_size: int,
        intermediate_size_per_partition: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs: Any,
    ) -> None:
        shard = intermediate_size_per_partition
        shape13, shape2 = (num_experts, 2 * shard, hidden_size), (num_experts, hidden_size, shard)
        layer.w13_weight = new_weight(shape13, params_dtype, **extra_weight_attrs)
        layer.w2_weight = new_weight(shape2, params_dtype, **extra_weight_attrs)
        layer.moe_kernel = MoEKernel.GROUPED  # chosen after loading

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """The layer keeps the kernel that runs its experts (select_moe_kernel). For the
        grouped loop, each expert's matrices take the layout their kernel streams fastest,
        as a linear layer's (prepack_linear_weight), stacked again: w13_weight[e] stays
        expert e's. The Triton kernel reads the plain [E, N, K] weights."""
        layer.moe_kernel = select_moe_kernel(layer.w13_weight)
        if layer.moe_kernel is MoEKernel.TRITON:
            return
        for name in ("w13_weight", "w2_weight"):
            experts = list(getattr(layer, name))
            packed = [prepack_linear_weight(w) for w in experts]
            if packed and packed[0] is not experts[0]:
                setattr(layer, name, nn.Parameter(torch.stack(packed), requires_grad=False))

    def apply_expert(self, layer: nn.Module, x: torch.Tensor, expert_id: int) -> torch.Tensor:
        gate_up = linear(x, layer.w13_weight[expert_id])
        return linear(layer.act_fn(gate_up), layer.w2_weight[expert_id])

    def apply(
        self, layer: nn.Module, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
    ) -> torch.Tensor:
        """Under expert parallelism the layer's expert_map turns the router's global ids
        into this rank's weight indices (-1: another rank's expert, zero here)."""
        if layer.moe_kernel is not MoEKernel.TRITON:
            return super().apply(layer, x, topk_weights, topk_ids)
        expert_map = layer.expert_map
        w13, w2 = layer.w13_weight, layer.w2_weight
        return fused_experts(
            x,
            w13,
            w2,
            topk_weights,
            topk_ids,
            expert_map=expert_map,
            global_num_experts=layer.num_experts,
        )
