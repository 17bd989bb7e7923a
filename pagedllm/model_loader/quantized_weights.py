"""A quantized Hugging Face checkpoint's tensors as pagedllm's layers take them.

Each quantized linear layer comes out as one `prefix.weight`: its GGUF blocks where the
layer runs in them (group_blocks.py says which layouts do; the quantization config's
`is_raw` which layers), else dequantized to the model's dtype. Every other tensor comes out
as iterate_safetensors_weights gives it; static activation and KV-cache scales are dropped.
"""

import re
from collections.abc import Callable, Iterator
from contextlib import ExitStack

import torch
from safetensors import SafetensorError, safe_open

from pagedllm.checkpoint_quant import CheckpointQuant
from pagedllm.logger import init_logger
from pagedllm.model_loader.checkpoint_formats import (
    PARTS,
    UNUSED_PARTS,
    is_quantized_layer,
    read_layer,
)
from pagedllm.model_loader.group_blocks import GroupQuantized, Q, native_block_type
from pagedllm.model_loader.safetensors import safetensors_files
from pagedllm.models.weight_loading import WeightsMapper

logger = init_logger(__name__)

_EXPERT = re.compile(r"(.*\.experts)\.\d+\.(\w+\.weight)$")


def type_name(name: str) -> str:
    """The name a GGUF config keys a weight's type by: experts' without their index."""
    expert = _EXPERT.match(name)
    return f"{expert.group(1)}.{expert.group(2)}" if expert else name


class CheckpointTensors:
    """Every tensor of a folder's safetensors files, read by name from whichever file."""

    def __init__(self, folder: str, stack: ExitStack) -> None:
        self.files: list[tuple[str, object]] = []
        self.where: dict[str, object] = {}
        for path in safetensors_files(folder):
            try:
                handle = stack.enter_context(safe_open(path, framework="pt"))
            except (SafetensorError, OSError) as e:
                raise ValueError(f"cannot read weight file {path}: {e}") from e
            self.files.append((path, handle))
            for name in handle.keys():
                self.where[name] = handle

    def has(self, name: str) -> bool:
        return name in self.where

    def get(self, name: str) -> torch.Tensor:
        return self._file(name).get_tensor(name)

    def shape(self, name: str) -> list[int]:
        return self._file(name).get_slice(name).get_shape()

    def _file(self, name: str) -> object:
        if name not in self.where:
            prefix = name.rpartition(".")[0]
            raise ValueError(f"the checkpoint has no tensor {name!r}, a part of layer {prefix!r}")
        return self.where[name]

    def names(self) -> Iterator[str]:
        for _, handle in self.files:
            yield from handle.keys()


def _layer_of(quant: CheckpointQuant, tensors: CheckpointTensors, name: str) -> str | None:
    """The quantized layer whose weight `name` is (or is a part of), else None."""
    prefix, _, leaf = name.rpartition(".")
    if leaf not in (*PARTS, "weight") or not prefix:
        return None
    return prefix if is_quantized_layer(quant, prefix, tensors.get, tensors.has) else None


def checkpoint_tensor_types(
    folder: str, quant: CheckpointQuant, mapper: WeightsMapper | None = None
) -> dict[str, int]:
    """The model's weight name (the checkpoint's, renamed by `mapper`) -> GGUF type of
    every quantized layer that runs in GGUF blocks (as GGUFConfig takes them); the other
    layers are dequantized at load. Read from the files' headers (and act-order layers'
    column groups), not their weights; layers the mapper drops (a vision tower) are not
    read at all. The quantization_config's targets match the checkpoint's names."""
    mapper = WeightsMapper() if mapper is None else mapper
    types: dict[str, int] = {}
    dequantized = 0
    with ExitStack() as stack:
        tensors = CheckpointTensors(folder, stack)
        for name in tensors.names():
            if mapper.map_name(name) is None:
                continue
            prefix = _layer_of(quant, tensors, name)
            if prefix is None or not name.endswith(_LAYER_MARKS):
                continue
            qtype = planned_type(quant, tensors, prefix)
            if qtype is None:
                dequantized += 1
            else:
                types[type_name(mapper.map_name(f"{prefix}.weight"))] = int(qtype)
    if dequantized:
        logger.info(
            "%s: %d quantized layers have no GGUF block layout and are dequantized at load",
            quant.method,
            dequantized,
        )
    return types


_LAYER_MARKS = (".qweight", ".weight_packed", ".weight")
"""The tensor a quantized layer comes out under; its other parts are read with it."""


def planned_type(quant: CheckpointQuant, tensors: CheckpointTensors, prefix: str) -> Q | None:
    """The GGUF type layer `prefix` runs in, None where it is dequantized: float schemes,
    act-order column groups, rows not of whole blocks, layouts no GGUF type holds."""
    scheme = quant.scheme(prefix)
    if scheme.kind != "int":
        return None
    columns = _columns(quant, tensors, prefix, scheme.bits)
    for g_idx in (f"{prefix}.g_idx", f"{prefix}.weight_g_idx"):
        if tensors.has(g_idx):
            group = scheme.group_size or columns
            in_order = torch.arange(columns) // group
            if not torch.equal(tensors.get(g_idx).to(torch.int64), in_order):
                return None
    return native_block_type(scheme.bits, scheme.symmetric, scheme.group_size or columns, columns)


def _columns(quant: CheckpointQuant, tensors: CheckpointTensors, prefix: str, bits: int) -> int:
    """The layer's input size K, from its tensors' shapes."""
    if quant.method == "gptq":
        return tensors.shape(f"{prefix}.qweight")[0] * 32 // bits
    if quant.method == "awq":
        return tensors.shape(f"{prefix}.qweight")[0]
    if tensors.has(f"{prefix}.weight_packed"):
        return int(tensors.get(f"{prefix}.weight_shape").reshape(-1)[-1])
    return tensors.shape(f"{prefix}.weight")[1]


def iterate_quantized_weights(
    folder: str,
    quant: CheckpointQuant,
    dtype: torch.dtype,
    keep_blocks: Callable[[str], bool] | None = None,
    keep: Callable[[str], bool] | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """`(HF name, tensor)` of the checkpoint, one layer at a time; a quantized layer's
    weight as its GGUF blocks where keep_blocks says so, else dequantized to dtype."""
    with ExitStack() as stack:
        tensors = CheckpointTensors(folder, stack)
        for name in list(tensors.names()):
            if name.rpartition(".")[2] in UNUSED_PARTS:
                continue
            prefix = _layer_of(quant, tensors, name)
            if prefix is None:
                if keep is None or keep(name):
                    yield name, _plain(quant, tensors, name).to(dtype)
                continue
            if not name.endswith(_LAYER_MARKS):
                continue  # a part read with its layer
            out = f"{prefix}.weight"
            if keep is not None and not keep(out):
                continue
            yield out, _converted(quant, tensors, prefix, dtype, keep_blocks)


def read_checked(
    quant: CheckpointQuant, tensors: CheckpointTensors, prefix: str
) -> GroupQuantized | torch.Tensor:
    """read_layer, whose tensors not fitting together (shapes from another bits or group
    size than the config's) is a ValueError naming the layer."""
    try:
        return read_layer(quant, prefix, tensors.get, tensors.has)
    except (RuntimeError, IndexError) as e:
        raise ValueError(
            f"{prefix}: its quantized tensors do not fit together or with the "
            f"quantization_config's bits and group size ({str(e).splitlines()[0]})"
        ) from e
    except ValueError as e:
        if prefix in str(e):
            raise
        raise ValueError(f"{prefix}: {e}") from e


def _plain(quant: CheckpointQuant, tensors: CheckpointTensors, name: str) -> torch.Tensor:
    """A tensor outside every quantized layer: a float one. Integer or fp8 values there are
    codes whose scale is missing."""
    tensor = tensors.get(name)
    if not tensor.is_floating_point() or tensor.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise ValueError(
            f"checkpoint tensor {name!r} is {tensor.dtype}: quantized values, but the "
            f"checkpoint has no scale for them ({quant.method})"
        )
    return tensor


def _converted(
    quant: CheckpointQuant,
    tensors: CheckpointTensors,
    prefix: str,
    dtype: torch.dtype,
    keep_blocks: Callable[[str], bool] | None,
) -> torch.Tensor:
    layer = read_checked(quant, tensors, prefix)
    if not isinstance(layer, GroupQuantized):
        return layer.to(dtype)
    if keep_blocks is None or not keep_blocks(f"{prefix}.weight"):
        return layer.dequantize(dtype)
    # the plan's type: read_checked gave groups in column order, so g_idx needs no second read
    scheme = quant.scheme(prefix)
    qtype = native_block_type(scheme.bits, scheme.symmetric, layer.group, layer.codes.shape[1])
    if qtype in (Q.Q4_0, Q.Q8_0) and layer.block_type() != qtype:
        raise ValueError(
            f"{prefix}: the quantization_config says symmetric {layer.bits}-bit weights, "
            f"whose zero points are all {1 << (layer.bits - 1)}; this layer's are not "
            "(pass quantization='none' to dequantize it as stored)"
        )
    return layer.to_blocks(qtype)
