"""`quantization="int8"`: float checkpoints quantized at load to symmetric 8-bit blocks.

The blocks are GGUF's Q8_0 (32 weights, one fp16 scale, 34 bytes), so int8 weights run
through the same kernels as a Q8_0 GGUF file. Every linear layer, the embedding and the LM
head are quantized; MoE routers stay in float, as llama.cpp keeps them, since a small
error there changes which experts run. A matrix whose rows are not whole blocks of 32
stays in float.

Weights load in float first and are quantized layer by layer after loading, so loading
peaks at the float model's size.
"""

from typing import Any

import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from torch import nn

from pagedllm._torch_quant import quantize_q8_0
from pagedllm.layers.quantization.base_config import (
    LayerKind,
    QuantizationConfig,
    QuantizeMethodBase,
)
from pagedllm.layers.quantization.gguf import lookup, matmul, pack_parameter
from pagedllm.layers.quantization.unquantized import (
    UnquantizedEmbeddingMethod,
    UnquantizedFusedMoEMethod,
    UnquantizedLinearMethod,
)

Q8_0 = int(GGMLQuantizationType.Q8_0)
_BLOCK = GGML_QUANT_SIZES[GGMLQuantizationType.Q8_0]


def quantizable(param: nn.Parameter) -> bool:
    """Rows of whole blocks, or already quantized through a module it is tied to."""
    return param.dtype == torch.uint8 or param.shape[-1] % _BLOCK[0] == 0


def quantize_parameters(*params: nn.Parameter) -> bool:
    """Replace each float [..., K] parameter's data by its Q8_0 blocks, in place, so every
    module sharing one (a tied LM head) sees them; all or none (False) are quantized."""
    if not all(quantizable(param) for param in params):
        return False
    for param in params:
        if param.dtype != torch.uint8:
            param.data = quantize_q8_0(param.data)
            param.qtype, param.block = Q8_0, _BLOCK
    return True


class Int8Config(QuantizationConfig):
    @classmethod
    def get_name(cls) -> str:
        return "int8"

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "Int8Config":
        return cls()

    def get_quant_method(self, layer: nn.Module, prefix: str) -> QuantizeMethodBase | None:
        kind = layer.quant_kind
        if kind is LayerKind.FUSED_MOE:
            return Int8FusedMoEMethod()
        if kind is LayerKind.LINEAR:
            return None if prefix.endswith("mlp.gate") else Int8LinearMethod()
        return Int8EmbeddingMethod()


class Int8LinearMethod(UnquantizedLinearMethod):
    quantized = False

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        self.quantized = quantize_parameters(layer.weight)
        if self.quantized:
            pack_parameter(layer.weight, Q8_0)

    def apply(
        self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        if not self.quantized:
            return super().apply(layer, x, bias)
        return matmul(x, layer.weight, layer.weight.packed, Q8_0, bias)


class Int8EmbeddingMethod(Int8LinearMethod, UnquantizedEmbeddingMethod):
    def embedding(self, layer: nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
        if not self.quantized:
            return super().embedding(layer, input_ids)
        return lookup(input_ids, layer.weight, Q8_0).to(layer.params_dtype)


class Int8FusedMoEMethod(UnquantizedFusedMoEMethod):
    quantized = False

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        self.quantized = quantize_parameters(layer.w13_weight, layer.w2_weight)
        if self.quantized:
            pack_parameter(layer.w13_weight, Q8_0)
            pack_parameter(layer.w2_weight, Q8_0)

    def apply_expert(self, layer: nn.Module, x: torch.Tensor, expert_id: int) -> torch.Tensor:
        if not self.quantized:
            return super().apply_expert(layer, x, expert_id)
        w13, w2 = layer.w13_weight, layer.w2_weight
        gate_up = matmul(x, w13[expert_id], w13.packed, Q8_0)
        return matmul(layer.act_fn(gate_up), w2[expert_id], w2.packed, Q8_0)
