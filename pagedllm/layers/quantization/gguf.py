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
from pagedllm.gguf.block_types import NATIVE_TYPES
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
    return new_weight(
        physical, torch.uint8, qtype=int(qtype), block=GGML_QUANT_SIZES[Q(qtype)], **attrs
    )


def pack_parameter(param: nn.Parameter, qtype: int) -> None:
    """Replace param's blocks [..., N, bytes] by the layout of the CPU's quantized matmul
    (ops.gguf_pack) where it runs, once: a tied LM head and embedding share the parameter.
    `param.packed` records (N, K) when packed, None when the blocks stay."""
    if hasattr(param, "packed"):
        return
    n, k = param.shape[-2], param.shape[-1] // param.block[1] * param.block[0]
    packed = ops.gguf_pack(param.data, qtype)
    param.packed = None if packed is None else (n, k)
    if packed is not None:
        param.data = packed


def matmul(
    x: torch.Tensor,
    weight: torch.Tensor,
    packed: tuple[int, int] | None,
    qtype: int,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """x @ W^T (+ bias) for W a GGUF matrix as pack_parameter left it: packed (N, K) or
    blocks (None)."""
    if packed is None:
        return ops.gguf_linear(x, weight, qtype, bias)
    return ops.gguf_packed_linear(x, weight, qtype, packed[0], bias)


def lookup(input_ids: torch.Tensor, weight: nn.Parameter, qtype: int) -> torch.Tensor:
    """Rows input_ids of a GGUF table as pack_parameter left it, as float32."""
    if weight.packed is None:
        return ops.gguf_embedding(input_ids, weight, qtype)
    return ops.gguf_packed_embedding(input_ids, weight, qtype, *weight.packed)


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

    def _checkpoint_names(self, prefix: str) -> list[str]:
        """The checkpoint weight of each shard of layer `prefix`: the shards' own tensors, or
        for a checkpoint that stores the fused layer whole (Phi-3's qkv_proj and
        gate_up_proj), that tensor for each."""
        parent, _, leaf = prefix.rpartition(".")
        members = self.packed_modules_mapping.get(leaf, [leaf])
        if f"{prefix}.weight" in self.tensor_types:
            return [f"{prefix}.weight"] * len(members)
        return [f"{parent}.{m}.weight" if parent else f"{m}.weight" for m in members]

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
        types = self._native_types(self._checkpoint_names(prefix))
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
        self.packed_segments: list[tuple[int, int, int, torch.Size]] | None = None
        """(rows, qtype, first byte, packed shape) of each segment once packed."""

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
            width = row_bytes(
                qtype,
                input_size_per_partition,
                getattr(layer, "prefix", "") or type(layer).__name__,
            )
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

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Packs the weight for the CPU's quantized matmul where it runs; a fused layer of
        mixed types packs each segment and keeps them side by side in one byte buffer."""
        if len(self.segments) == 1:
            pack_parameter(layer.weight, self.shard_types[0])
            return
        parts = [
            ops.gguf_pack(self._segment_view(layer.weight, segment), segment[2])
            for segment in self.segments
        ]
        if any(part is None for part in parts):
            return
        self.packed_segments, first_byte = [], 0
        for segment, part in zip(self.segments, parts, strict=True):
            self.packed_segments.append((segment[1], segment[2], first_byte, part.shape))
            first_byte += part.numel()
        layer.weight.data = torch.cat([part.reshape(-1) for part in parts])

    def _segment_matrices(
        self, weight: torch.Tensor
    ) -> list[tuple[torch.Tensor, tuple[int, int] | None, int]]:
        """Each segment's (matrix, packed (N, K) or None, qtype)."""
        if self.packed_segments is None:
            return [(self._segment_view(weight, s), None, s[2]) for s in self.segments]
        return [
            (
                weight.narrow(0, first, shape.numel()).view(shape),
                (rows, self.input_size_per_partition),
                qtype,
            )
            for rows, qtype, first, shape in self.packed_segments
        ]

    def apply(
        self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        if len(self.segments) == 1:
            return matmul(x, layer.weight, layer.weight.packed, self.shard_types[0], bias)
        parts = [
            matmul(x, w, packed, qtype) for w, packed, qtype in self._segment_matrices(layer.weight)
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

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        pack_parameter(layer.weight, self.qtype)

    def embedding(self, layer: nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
        return lookup(input_ids, layer.weight, self.qtype).to(layer.params_dtype)

    def apply(
        self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        return matmul(x, layer.weight, layer.weight.packed, self.qtype, bias)


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
            (num_experts, 2 * shard, hidden_size),
            self.w13_type,
            "experts' gate/up",
            **extra_weight_attrs,
        )
        layer.w2_weight = block_weight(
            (num_experts, hidden_size, shard), self.w2_type, "experts' down", **extra_weight_attrs
        )

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        pack_parameter(layer.w13_weight, self.w13_type)
        pack_parameter(layer.w2_weight, self.w2_type)

    def apply_expert(self, layer: nn.Module, x: torch.Tensor, expert_id: int) -> torch.Tensor:
        w13, w2 = layer.w13_weight, layer.w2_weight
        gate_up = matmul(x, w13[expert_id], w13.packed, self.w13_type)
        return matmul(layer.act_fn(gate_up), w2[expert_id], w2.packed, self.w2_type)
