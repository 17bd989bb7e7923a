"""GGUF weights run in their own block formats (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K,
Q6_K), as llama.cpp runs them: a weight is a uint8 tensor [rows, K / block_size * type_size]
of the file's blocks, multiplied by _custom_ops.gguf_linear.

The config is read from the file's header: the GGUF type of every checkpoint tensor, under
its Hugging Face name. A layer runs natively when every checkpoint tensor it holds has a
native type; otherwise it is left in float and the loader dequantizes its tensors.
"""

import re
from typing import Any

import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from torch import nn

from pagedllm import _custom_ops as ops
from pagedllm.layers.quantization.base_config import (
    EmbeddingMethodBase,
    FusedMoEMethodBase,
    LayerKind,
    LinearMethodBase,
    QuantizationConfig,
    QuantizeMethodBase,
    new_weight,
)

Q = GGMLQuantizationType
NATIVE_TYPES = frozenset((Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q4_K, Q.Q5_K, Q.Q6_K))
"""The GGUF types pagedllm multiplies without dequantizing the weight."""

_EXPERT_NAME = re.compile(r"(.*\.experts)\.\d+\.(\w+)\.weight$")
_EXPERT_PARTS = ("gate_proj", "up_proj", "down_proj")


def row_bytes(qtype: int, columns: int, what: str) -> int:
    """Bytes of a row of `columns` weights; ValueError when they are not whole blocks."""
    block_size, type_size = GGML_QUANT_SIZES[Q(qtype)]
    if columns % block_size:
        raise ValueError(
            f"{what}: {columns} columns are not whole {Q(qtype).name} blocks of {block_size} "
            "(a tensor parallel size that splits rows into such shards cannot run this file)"
        )
    return columns // block_size * type_size


def block_weight(shape: tuple[int, ...], qtype: int, what: str, **attrs: Any) -> nn.Parameter:
    """A uint8 parameter holding [..., rows, columns] weights as rows of `qtype` blocks; its
    `block` attribute (block_size, type_size) lets loaders split rows on block boundaries."""
    physical = (*shape[:-1], row_bytes(qtype, shape[-1], what))
    return new_weight(physical, torch.uint8, qtype=int(qtype), block=GGML_QUANT_SIZES[Q(qtype)],
                      **attrs)  # fmt: skip


class GGUFConfig(QuantizationConfig):
    def __init__(self, tensor_types: dict[str, int]) -> None:
        self.tensor_types = tensor_types
        """HF checkpoint name -> GGUF type of every 2-D or stacked weight; stacked experts
        under `...mlp.experts.gate_proj.weight` (no expert index)."""

    @classmethod
    def get_name(cls) -> str:
        return "gguf"

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "GGUFConfig":
        return cls(dict(config["tensor_types"]))

    def _group(self, name: str) -> list[str]:
        """The checkpoint weights that share a parameter with checkpoint weight `name`."""
        expert = _EXPERT_NAME.match(name)
        if expert:
            return [f"{expert.group(1)}.{part}.weight" for part in _EXPERT_PARTS]
        parent, _, leaf = name.removesuffix(".weight").rpartition(".")
        for members in self.packed_modules_mapping.values():
            if leaf in members:
                return [f"{parent}.{member}.weight" for member in members]
        return [name]

    def _native_types(self, names: list[str]) -> list[int] | None:
        types = [self.tensor_types.get(name) for name in names]
        return types if all(t in NATIVE_TYPES for t in types) else None

    def is_raw(self, name: str) -> bool:
        """Whether the loader hands checkpoint tensor `name` over as its GGUF blocks."""
        return name.endswith(".weight") and self._native_types(self._group(name)) is not None

    def get_quant_method(self, layer: nn.Module, prefix: str) -> QuantizeMethodBase | None:
        kind = layer.quant_kind
        if kind is LayerKind.FUSED_MOE:
            types = self._native_types(self._group(f"{prefix}.0.gate_proj.weight"))
            if types is None or types[0] != types[1]:
                return None
            return GGUFFusedMoEMethod(types[0], types[2])
        if kind is LayerKind.LM_HEAD and "lm_head.weight" not in self.tensor_types:
            prefix = "model.embed_tokens"  # tied: the head is the embedding
        parent, _, leaf = prefix.rpartition(".")
        members = self.packed_modules_mapping.get(leaf, [leaf])
        names = [f"{parent}.{m}.weight" if parent else f"{m}.weight" for m in members]
        types = self._native_types(names)
        if types is None:
            return None
        if kind is LayerKind.LINEAR:
            return GGUFLinearMethod(types)
        return GGUFEmbeddingMethod(types[0])


class GGUFLinearMethod(LinearMethodBase):
    """A (possibly fused) linear layer whose shards are GGUF blocks.

    Shards of one type (the usual case) share one [N, row_bytes] weight and one matmul. A
    fused layer whose shards differ (Q4_K_M files store some v projections as Q6_K beside
    Q4_K q and k) keeps its rows in one flat byte buffer of per-type segments, each
    multiplied on its own and the outputs concatenated.
    """

    def __init__(self, shard_types: list[int]) -> None:
        self.shard_types = shard_types
        self.segments: list[tuple[int, int, int, int]] = []
        """(first row, rows, qtype, first byte) of each run of same-type shards."""

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
        row, byte = 0, 0
        for size, qtype in zip(output_partition_sizes, self.shard_types, strict=True):
            width = row_bytes(qtype, input_size_per_partition, type(layer).__name__)
            if self.segments and self.segments[-1][2] == qtype:
                first_row, rows, _, first_byte = self.segments[-1]
                self.segments[-1] = (first_row, rows + size, qtype, first_byte)
            else:
                self.segments.append((row, size, qtype, byte))
            row, byte = row + size, byte + size * width
        shape = (row, input_size_per_partition)
        if len(self.segments) == 1:
            layer.weight = block_weight(shape, self.shard_types[0], "weight", **extra_weight_attrs)
        else:
            layer.weight = new_weight((byte,), torch.uint8, **extra_weight_attrs)
        self.input_size_per_partition = input_size_per_partition

    def _segment_view(self, buffer: torch.Tensor, segment: tuple) -> torch.Tensor:
        _, rows, qtype, first_byte = segment
        width = row_bytes(qtype, self.input_size_per_partition, "weight")
        return buffer.narrow(0, first_byte, rows * width).view(rows, width)

    def weight_rows(self, param: nn.Parameter, offset: int, size: int) -> torch.Tensor:
        if len(self.segments) == 1:
            return param.data.narrow(0, offset, size)
        for segment in self.segments:
            first_row, rows = segment[:2]
            if first_row <= offset and offset + size <= first_row + rows:
                return self._segment_view(param.data, segment).narrow(0, offset - first_row, size)
        raise ValueError(f"rows [{offset}, {offset + size}) straddle GGUF types")

    def apply(
        self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        if len(self.segments) == 1:
            return ops.gguf_linear(x, layer.weight, self.shard_types[0], bias)
        parts = [
            ops.gguf_linear(x, self._segment_view(layer.weight, segment), segment[2])
            for segment in self.segments
        ]
        y = torch.cat(parts, dim=-1)
        return y if bias is None else y + bias


class GGUFEmbeddingMethod(EmbeddingMethodBase):
    """The vocabulary as GGUF blocks: lookups dequantize only their rows; the LM head
    multiplies the blocks as any GGUF linear does."""

    def __init__(self, qtype: int) -> None:
        self.qtype = qtype

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
        layer.weight = block_weight(shape, self.qtype, "embedding", **extra_weight_attrs)

    def embedding(self, layer: nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
        return ops.gguf_embedding(input_ids, layer.weight, self.qtype).to(layer.params_dtype)

    def apply(
        self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        return ops.gguf_linear(x, layer.weight, self.qtype, bias)


class GGUFFusedMoEMethod(FusedMoEMethodBase):
    """Experts as GGUF blocks: gate and up (one type) stacked in w13, down in w2."""

    def __init__(self, w13_type: int, w2_type: int) -> None:
        self.w13_type, self.w2_type = w13_type, w2_type

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
        layer.w13_weight = block_weight(
            (num_experts, 2 * shard, hidden_size), self.w13_type, "experts' gate/up",
            **extra_weight_attrs,
        )  # fmt: skip
        layer.w2_weight = block_weight(
            (num_experts, hidden_size, shard), self.w2_type, "experts' down", **extra_weight_attrs
        )

    def apply_expert(self, layer: nn.Module, x: torch.Tensor, expert_id: int) -> torch.Tensor:
        gate_up = ops.gguf_linear(x, layer.w13_weight[expert_id], self.w13_type)
        return ops.gguf_linear(layer.act_fn(gate_up), layer.w2_weight[expert_id], self.w2_type)
