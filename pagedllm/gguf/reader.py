"""Parse a GGUF file's header (metadata and tensor directory) and dequantize its tensors.

The header is parsed here with `struct` over an `mmap`, not with `gguf.GGUFReader`: that reader
makes a numpy view of every metadata string, ~3.5 s for SmolLM2's 49k tokens and 49k merges on a
2-core machine, where skipping over them takes ~0.05 s. Tensor data stays mapped until a tensor is
asked for, then `gguf.quants.dequantize` unpacks it.
"""

import math
import mmap
import os
import struct
import warnings
from typing import Any, NamedTuple

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType
from gguf.quants import dequantize, quant_shape_to_byte_shape

_GGUF_VERSIONS = (2, 3)
_ALIGNMENT_KEY = "general.alignment"
_DEFAULT_ALIGNMENT = 32  # llama.cpp's, when `general.alignment` is absent
_SCALAR_FORMATS = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}


class TensorInfo(NamedTuple):
    """Where one tensor lies in the file. `shape` is in torch order (ggml lists it reversed)."""

    name: str
    shape: tuple[int, ...]
    qtype: GGMLQuantizationType
    start: int  # absolute byte offset of its data
    nbytes: int


class StringArray(NamedTuple):
    """An array of strings (the vocabulary, the merges) kept as its length: nothing here reads
    them (transformers builds the tokenizer), and decoding 100k strings would cost ~0.3 s."""

    length: int


class GGUFFile(NamedTuple):
    """A parsed GGUF header over the memory-mapped file: metadata values are Python ints,
    floats, bools and strings, numpy arrays (arrays of numbers) and StringArray."""

    path: str
    metadata: dict[str, Any]
    tensors: dict[str, TensorInfo]
    data: mmap.mmap


class _Cursor:
    """Reads little-endian GGUF values forward from `pos`; struct.error past the end."""

    def __init__(self, buf: mmap.mmap, pos: int) -> None:
        self.buf = buf
        self.pos = pos

    def unpack(self, fmt: str) -> tuple[Any, ...]:
        values = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return values

    def string(self) -> str:
        (length,) = self.unpack("<Q")
        end = self.pos + length
        if end > len(self.buf):
            raise ValueError(f"a string of {length} bytes at byte {self.pos} runs past the end")
        text = self.buf[self.pos : end].decode("utf-8")
        self.pos = end
        return text

    def value(self, value_type: int) -> Any:
        if value_type == GGUFValueType.STRING:
            return self.string()
        if value_type == GGUFValueType.ARRAY:
            return self.array()
        (value,) = self.unpack(_SCALAR_FORMATS[GGUFValueType(value_type)])
        return value

    def array(self) -> np.ndarray | StringArray:
        element_type, count = self.unpack("<IQ")
        if element_type == GGUFValueType.STRING:
            for _ in range(count):
                (length,) = self.unpack("<Q")
                self.pos += length
            return StringArray(count)
        dtype = np.dtype(_SCALAR_FORMATS[GGUFValueType(element_type)])
        values = np.frombuffer(self.buf, dtype, count=count, offset=self.pos).copy()
        self.pos += values.nbytes
        return values


def read_gguf(path: str) -> GGUFFile:
    """Parse the header of the GGUF file at `path`, leaving the tensor data mapped, unread.

    FileNotFoundError for a missing file; ValueError, naming the file, for one that is not GGUF,
    is truncated or corrupt, repeats a metadata key or a tensor name, has an alignment that is
    not a power of two (llama.cpp refuses all three), or is one shard of a split GGUF.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"GGUF file not found: {path}")
    with open(path, "rb") as f:
        magic = f.read(4)
        if magic != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file: it starts with {magic!r}, not b'GGUF'")
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        metadata, tensors = _parse_header(data)
    except _InvalidHeader as e:
        raise ValueError(f"{path}: {e}") from None
    except (ValueError, KeyError, struct.error, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is truncated or corrupt: {e}") from e
    _refuse_split_shard(path, metadata)
    return GGUFFile(path, metadata, tensors, data)


class _InvalidHeader(ValueError):
    """A header that parses but that llama.cpp refuses (a repeated key, a bad alignment)."""


def _parse_header(data: mmap.mmap) -> tuple[dict[str, Any], dict[str, TensorInfo]]:
    cursor = _Cursor(data, 4)
    version, tensor_count, kv_count = cursor.unpack("<IQQ")
    if version not in _GGUF_VERSIONS:
        raise ValueError(f"GGUF version {version} is not one of {_GGUF_VERSIONS}")
    metadata = {}
    for _ in range(kv_count):
        key = cursor.string()
        (value_type,) = cursor.unpack("<I")
        if key in metadata:
            raise _InvalidHeader(f"metadata key {key!r} appears twice")
        metadata[key] = cursor.value(value_type)
    entries = [_read_tensor_entry(cursor) for _ in range(tensor_count)]
    data_start = _align(cursor.pos, _alignment(metadata))
    tensors = {}
    for name, shape, qtype, offset in entries:
        if name in tensors:
            raise _InvalidHeader(f"tensor {name!r} appears twice")
        info = TensorInfo(name, shape, qtype, data_start + offset, _byte_count(name, shape, qtype))
        if info.start + info.nbytes > len(data):
            raise ValueError(
                f"tensor {name} ends at byte {info.start + info.nbytes}, "
                f"but the file has {len(data)} bytes"
            )
        tensors[name] = info
    return metadata, tensors


def _alignment(metadata: dict[str, Any]) -> int:
    """`general.alignment`: a positive power of two, as llama.cpp requires."""
    alignment = metadata.get(_ALIGNMENT_KEY, _DEFAULT_ALIGNMENT)
    if not _is_int(alignment) or alignment <= 0 or alignment & (alignment - 1):
        raise _InvalidHeader(
            f"metadata key {_ALIGNMENT_KEY!r} is {alignment!r}; it must be a power of two >= 1"
        )
    return alignment


def _align(pos: int, alignment: int) -> int:
    return -(-pos // alignment) * alignment


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _refuse_split_shard(path: str, metadata: dict[str, Any]) -> None:
    """llama.cpp's `llama-gguf-split` cuts a model into `NAME-00001-of-0000N.gguf` files that
    each hold a part of the tensors; like vLLM, pagedllm reads a single-file GGUF only."""
    count = metadata.get("split.count", 1)
    if _is_int(count) and count > 1:
        index = metadata.get("split.no", 0)
        shard = index + 1 if _is_int(index) else "?"
        raise ValueError(
            f"{path} is shard {shard} of {count} of a split GGUF; merge the shards into one "
            "file with llama.cpp's `llama-gguf-split --merge FIRST_SHARD OUTPUT.gguf`"
        )


def _read_tensor_entry(cursor: _Cursor) -> tuple[str, tuple[int, ...], GGMLQuantizationType, int]:
    """`(name, shape in torch order, type, offset in the data section)`."""
    name = cursor.string()
    (dim_count,) = cursor.unpack("<I")
    dims = cursor.unpack(f"<{dim_count}Q")
    type_id, offset = cursor.unpack("<IQ")
    return name, tuple(reversed(dims)), GGMLQuantizationType(type_id), offset


def _byte_count(name: str, shape: tuple[int, ...], qtype: GGMLQuantizationType) -> int:
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    if shape and shape[-1] % block_size:
        raise ValueError(f"tensor {name}: rows of {shape[-1]} are not whole {qtype.name} blocks")
    return math.prod(shape) // block_size * type_size


def read_tensor(gguf: GGUFFile, info: TensorInfo) -> torch.Tensor:
    """The tensor's values in float32, copied out of the mapped file. [info.shape]"""
    raw = np.frombuffer(gguf.data, np.uint8, count=info.nbytes, offset=info.start)
    try:
        values = dequantize(
            raw.reshape(quant_shape_to_byte_shape(info.shape, info.qtype)), info.qtype
        )
    except NotImplementedError as e:
        raise ValueError(
            f"{gguf.path}: tensor {info.name} is stored as {info.qtype.name}, "
            "which gguf.quants cannot dequantize"
        ) from e
    # F32 data comes back as a read-only view of the map: copy it, once
    return torch.from_numpy(np.require(values, np.float32, "W"))


def narrow(info: TensorInfo, start: int, length: int) -> TensorInfo:
    """Rows [start, start + length) of the tensor's first dimension (experts of a stacked
    [E, out, in] tensor), as a tensor of its own that read_tensor and read_blocks read without
    touching the rest: each row of the first dimension is whole blocks and they lie one after
    another, so the part is one contiguous run of the file's bytes."""
    assert 0 <= start <= start + length <= info.shape[0], (info.name, start, length)
    per_row = info.nbytes // info.shape[0]
    shape = (length, *info.shape[1:])
    return TensorInfo(info.name, shape, info.qtype, info.start + start * per_row, length * per_row)


def read_blocks(gguf: GGUFFile, info: TensorInfo) -> torch.Tensor:
    """The tensor's bytes as stored, [*shape[:-1], bytes per row] uint8: rows of the type's
    blocks, a read-only view of the mapped file (copy it before writing)."""
    rows = info.shape[:-1]
    with warnings.catch_warnings():  # torch warns that the map is not writable
        warnings.simplefilter("ignore", UserWarning)
        data = torch.frombuffer(gguf.data, dtype=torch.uint8, count=info.nbytes, offset=info.start)
    return data.view(*rows, info.nbytes // max(math.prod(rows), 1))
