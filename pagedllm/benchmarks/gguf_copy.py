"""A copy of a GGUF file with its weights in another type (F32, F16 or Q8_0), cached on disk.

The benchmarks use it to run pagedllm and llama.cpp on the same weights at a chosen precision:
llama.cpp computes in the type its file stores, so an F32 copy makes it do pagedllm's float32
arithmetic, and a Q8_0 copy gives both engines a common 8-bit file. Like llama.cpp's own
quantizer, only weights convert: 1-D tensors (norms, biases) and the MoE router
(`ffn_gate_inp`) stay F32, and so does a weight whose rows do not fill whole blocks of the
target type. Every other tensor is dequantized with `gguf.quants.dequantize` and re-encoded
with `gguf.quants.quantize`; the metadata is copied, and `general.file_type` set to match.
"""

import os

import numpy as np
from gguf import (
    GGML_QUANT_SIZES,
    GGMLQuantizationType,
    GGUFReader,
    GGUFValueType,
    GGUFWriter,
    Keys,
    LlamaFileType,
)
from gguf.gguf_reader import ReaderTensor
from gguf.quants import dequantize, quantize

from pagedllm.gguf.reader import read_gguf

F32, F16, Q8_0 = GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.Q8_0
GGUF_TYPES = {"f32": F32, "f16": F16, "q8_0": Q8_0}
_FILE_TYPES = {
    F32: LlamaFileType.ALL_F32,
    F16: LlamaFileType.MOSTLY_F16,
    Q8_0: LlamaFileType.MOSTLY_Q8_0,
}


def copy_type(
    name: str, shape: tuple[int, ...], qtype: GGMLQuantizationType
) -> GGMLQuantizationType:
    """The type a tensor of `shape` (torch order: rows last) gets in a `qtype` copy."""
    if len(shape) < 2 or "ffn_gate_inp" in name:
        return F32
    block_size = GGML_QUANT_SIZES[qtype][0]
    return qtype if shape[-1] % block_size == 0 else F32


def gguf_copy_path(source: str, qtype: GGMLQuantizationType) -> str:
    """A GGUF with `source`'s weights in `qtype`: `source` itself when every tensor already has
    its copy type, else a copy cached in ~/.cache/pagedllm (rewritten when `source` is newer)."""
    if qtype not in _FILE_TYPES:
        raise ValueError(f"GGUF copy type {qtype.name} is not supported; use F32, F16 or Q8_0")
    tensors = read_gguf(source).tensors.values()
    if all(t.qtype == copy_type(t.name, t.shape, qtype) for t in tensors):
        return source
    stem = os.path.splitext(os.path.basename(source))[0]
    target = os.path.join(cache_dir(), f"{stem}.{qtype.name}.gguf")
    if not os.path.isfile(target) or os.path.getmtime(target) < os.path.getmtime(source):
        os.makedirs(cache_dir(), exist_ok=True)
        write_gguf_copy(GGUFReader(source), target + ".tmp", qtype)
        os.replace(target + ".tmp", target)
    return target


def cache_dir() -> str:
    """$XDG_CACHE_HOME/pagedllm (default ~/.cache/pagedllm): the benchmarks' converted models."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "pagedllm")


def write_gguf_copy(reader: GGUFReader, target: str, qtype: GGMLQuantizationType) -> None:
    """Write `reader`'s metadata and tensors, each converted to its `copy_type`, to `target`.
    Tensors are converted one at a time, so memory holds one tensor, not the model."""
    arch = reader.fields[Keys.General.ARCHITECTURE].contents()
    writer = GGUFWriter(target, arch)
    skipped = (Keys.General.ARCHITECTURE, Keys.General.ALIGNMENT, Keys.General.FILE_TYPE)
    for field in reader.fields.values():
        if field.name in skipped or field.name.startswith("GGUF."):
            continue
        value_type = field.types[0]
        sub_type = field.types[-1] if value_type == GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), value_type, sub_type=sub_type)
    writer.add_file_type(_FILE_TYPES[qtype])
    types = [copy_type(t.name, _torch_shape(t), qtype) for t in reader.tensors]
    for tensor, kind in zip(reader.tensors, types):
        shape = _torch_shape(tensor)
        block_size, type_size = GGML_QUANT_SIZES[kind]
        nbytes = int(np.prod(shape)) // block_size * type_size
        # A float32 dtype with raw_dtype: the shape is taken as elements, not bytes.
        writer.add_tensor_info(tensor.name, shape, np.dtype(np.float32), nbytes, kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tensor, kind in zip(reader.tensors, types):
        weights = dequantize(tensor.data, tensor.tensor_type).astype(np.float32, copy=False)
        writer.write_tensor_data(quantize(weights.reshape(_torch_shape(tensor)), kind))
    writer.close()


def _torch_shape(tensor: ReaderTensor) -> tuple[int, ...]:
    """GGUFReader lists a tensor's dimensions innermost first (ggml's order); reversed."""
    return tuple(int(d) for d in reversed(tensor.shape.tolist()))
