"""Read a GGUF file (llama.cpp's format) as a Hugging Face checkpoint: its config, its tokenizer,
and its tensors dequantized under HF names, so a GGUF model loads like a safetensors one.

Supported architectures: llama, qwen2, qwen3, qwen3moe.

The header is parsed here with `struct` over an `mmap`, not with `gguf.GGUFReader`: that reader
makes a numpy view of every metadata string, ~3.5 s for SmolLM2's 49k tokens and 49k merges on a
2-core machine, where skipping over them takes ~0.05 s. Tensor data stays mapped until a tensor is
asked for, then `gguf.quants.dequantize` unpacks it.
"""

import math
import mmap
import os
import struct
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType
from gguf.quants import dequantize, quant_shape_to_byte_shape
from tokenizers import pre_tokenizers
from transformers import (
    AutoConfig,
    PretrainedConfig,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

# GGUF architecture -> (transformers model_type, the `architectures` entry of its config)
_ARCHITECTURES = {
    "llama": ("llama", "LlamaForCausalLM"),
    "qwen2": ("qwen2", "Qwen2ForCausalLM"),
    "qwen3": ("qwen3", "Qwen3ForCausalLM"),
    "qwen3moe": ("qwen3_moe", "Qwen3MoeForCausalLM"),
}
_GGUF_VERSIONS = (2, 3)
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

# GGUF tensor names (without ".weight"/".bias") -> HF names
_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_gate_inp": "mlp.gate",
}
# stacked expert tensors [E, out, in] -> the per-expert names of HF checkpoints
_EXPERT_NAMES = {
    "ffn_gate_exps": "gate_proj",
    "ffn_up_exps": "up_proj",
    "ffn_down_exps": "down_proj",
}
# the Llama 3 rope scaling this holds is rebuilt into the config (see _llama3_rope_scaling)
_ROPE_FREQS = "rope_freqs.weight"

# Every Llama 3.1-3.3 model's rope scaling, apart from the factor.
_LLAMA3_ROPE = {
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
# llama.cpp's pre-tokenizer type for SmolLM's tokenizer (see load_gguf_tokenizer)
_SMOLLM_PRE = "smollm"


class TensorInfo(NamedTuple):
    """Where one tensor lies in the file. `shape` is in torch order (ggml lists it reversed)."""

    name: str
    shape: tuple[int, ...]
    qtype: GGMLQuantizationType
    start: int  # absolute byte offset of its data
    nbytes: int


class GGUFFile(NamedTuple):
    """A parsed GGUF header over the memory-mapped file.

    Arrays of strings (the vocabulary, the merges) are kept as their length: nothing here reads
    them (transformers builds the tokenizer), and decoding 100k strings would cost ~0.3 s.
    Arrays of numbers are numpy arrays.
    """

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

    def array(self) -> np.ndarray | int:
        element_type, count = self.unpack("<IQ")
        if element_type == GGUFValueType.STRING:
            for _ in range(count):
                (length,) = self.unpack("<Q")
                self.pos += length
            return count
        dtype = np.dtype(_SCALAR_FORMATS[GGUFValueType(element_type)])
        values = np.frombuffer(self.buf, dtype, count=count, offset=self.pos).copy()
        self.pos += values.nbytes
        return values


def read_gguf(path: str) -> GGUFFile:
    """Parse the header of the GGUF file at `path`, leaving the tensor data mapped, unread.

    FileNotFoundError for a missing file; ValueError, naming the file, for one that is not GGUF,
    or is truncated or corrupt.
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
    except (ValueError, KeyError, struct.error, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is truncated or corrupt: {e}") from e
    return GGUFFile(path, metadata, tensors, data)


def _parse_header(data: mmap.mmap) -> tuple[dict[str, Any], dict[str, TensorInfo]]:
    cursor = _Cursor(data, 4)
    version, tensor_count, kv_count = cursor.unpack("<IQQ")
    if version not in _GGUF_VERSIONS:
        raise ValueError(f"GGUF version {version} is not one of {_GGUF_VERSIONS}")
    metadata = {}
    for _ in range(kv_count):
        key = cursor.string()
        (value_type,) = cursor.unpack("<I")
        metadata[key] = cursor.value(value_type)
    entries = [_read_tensor_entry(cursor) for _ in range(tensor_count)]
    alignment = metadata.get("general.alignment", _DEFAULT_ALIGNMENT)
    data_start = -(-cursor.pos // alignment) * alignment
    tensors = {}
    for name, shape, qtype, offset in entries:
        info = TensorInfo(name, shape, qtype, data_start + offset, _byte_count(name, shape, qtype))
        if info.start + info.nbytes > len(data):
            raise ValueError(
                f"tensor {name} ends at byte {info.start + info.nbytes}, "
                f"but the file has {len(data)} bytes"
            )
        tensors[name] = info
    return metadata, tensors


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


def _architecture(gguf: GGUFFile) -> str:
    architecture = gguf.metadata.get("general.architecture")
    if architecture not in _ARCHITECTURES:
        raise ValueError(
            f"{gguf.path}: GGUF architecture {architecture!r} is not supported; "
            f"supported: {sorted(_ARCHITECTURES)}"
        )
    return architecture


def _required(gguf: GGUFFile, key: str) -> Any:
    if key not in gguf.metadata:
        raise ValueError(f"{gguf.path} has no metadata key {key!r}, which its architecture needs")
    return gguf.metadata[key]


def load_gguf_config(path: str) -> PretrainedConfig:
    """The transformers config that the GGUF metadata describes (a GGUF has no config.json)."""
    return _config(read_gguf(path))


def _config(gguf: GGUFFile) -> PretrainedConfig:
    arch = _architecture(gguf)
    model_type, model_class = _ARCHITECTURES[arch]
    heads = _required(gguf, f"{arch}.attention.head_count")
    hidden_size = _required(gguf, f"{arch}.embedding_length")
    kwargs = {
        "architectures": [model_class],
        "hidden_size": hidden_size,
        "num_hidden_layers": _required(gguf, f"{arch}.block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": gguf.metadata.get(f"{arch}.attention.head_count_kv", heads),
        "head_dim": _head_dim(gguf, arch, hidden_size // heads),
        "rms_norm_eps": _required(gguf, f"{arch}.attention.layer_norm_rms_epsilon"),
        "max_position_embeddings": _required(gguf, f"{arch}.context_length"),
        # the embedding's rows, which the weights need; llama.cpp pads the token list to match
        "vocab_size": _required_tensor(gguf, "token_embd.weight").shape[0],
        # llama.cpp writes output.weight only when it is not the embedding matrix
        "tie_word_embeddings": "output.weight" not in gguf.tensors,
        "bos_token_id": gguf.metadata.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": gguf.metadata.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": gguf.metadata.get("tokenizer.ggml.padding_token_id"),
    }
    kwargs["rope_parameters"] = _rope_parameters(gguf, arch, kwargs["head_dim"])
    if f"{arch}.feed_forward_length" in gguf.metadata:  # absent from some all-expert files
        kwargs["intermediate_size"] = gguf.metadata[f"{arch}.feed_forward_length"]
    if arch != "qwen2":  # Qwen2 always has q/k/v biases; the others say so in their config
        kwargs["attention_bias"] = "blk.0.attn_q.bias" in gguf.tensors
    if arch == "qwen3moe":
        kwargs |= _moe_kwargs(gguf, arch)
    return AutoConfig.for_model(model_type, **kwargs)


def _required_tensor(gguf: GGUFFile, name: str) -> TensorInfo:
    if name not in gguf.tensors:
        raise ValueError(f"{gguf.path} has no tensor {name!r}")
    return gguf.tensors[name]


def _head_dim(gguf: GGUFFile, arch: str, default: int) -> int:
    """`attention.key_length` where written; else the rotary width, which is the whole head in
    every architecture here; else hidden_size / heads."""
    for key in (f"{arch}.attention.key_length", f"{arch}.rope.dimension_count"):
        if key in gguf.metadata:
            return gguf.metadata[key]
    return default


def _moe_kwargs(gguf: GGUFFile, arch: str) -> dict[str, Any]:
    return {
        "num_experts": _required(gguf, f"{arch}.expert_count"),
        "num_experts_per_tok": _required(gguf, f"{arch}.expert_used_count"),
        "moe_intermediate_size": _required(gguf, f"{arch}.expert_feed_forward_length"),
        # llama.cpp renormalizes the top-k routing weights of qwen3moe; the file does not say so
        "norm_topk_prob": True,
    }


def _rope_parameters(gguf: GGUFFile, arch: str, head_dim: int) -> dict[str, Any]:
    """transformers' `rope_parameters`: theta, and the scaling the file describes."""
    theta = float(gguf.metadata.get(f"{arch}.rope.freq_base", 10000.0))  # llama.cpp's default
    params: dict[str, Any] = {"rope_type": "default", "rope_theta": theta}
    scaling = gguf.metadata.get(f"{arch}.rope.scaling.type", "none")
    if scaling not in ("none", "linear", "yarn"):
        raise ValueError(
            f"{gguf.path}: rope scaling type {scaling!r} is not supported; "
            "supported: 'none', 'linear', 'yarn'"
        )
    if scaling != "none":
        factor = float(_required(gguf, f"{arch}.rope.scaling.factor"))
        params |= {"rope_type": scaling, "factor": factor}
    if scaling == "yarn":
        original = _required(gguf, f"{arch}.rope.scaling.original_context_length")
        params["original_max_position_embeddings"] = original
    if _ROPE_FREQS in gguf.tensors:
        params |= _llama3_rope_scaling(gguf, theta, head_dim)
    return params


def _llama3_rope_scaling(gguf: GGUFFile, theta: float, head_dim: int) -> dict[str, Any]:
    """Llama 3 rope scaling, which llama.cpp keeps only as the tensor rope_freqs: one divisor
    per rotary frequency, not the four parameters. Rather than fit them, take every Llama 3.x
    model's values with the largest divisor as the factor, and check they rebuild the tensor."""
    divisors = _dequantize(gguf, gguf.tensors[_ROPE_FREQS]).numpy()
    params = {"rope_type": "llama3", "factor": float(divisors.max()), **_LLAMA3_ROPE}
    expected = _llama3_divisors(params, theta, head_dim)
    if expected.shape != divisors.shape or not np.allclose(expected, divisors, rtol=1e-5):
        raise ValueError(
            f"{gguf.path}: {_ROPE_FREQS} is not Llama 3 rope scaling with {params}; "
            "other rope_freqs are not supported"
        )
    return params


def _llama3_divisors(params: dict[str, Any], theta: float, head_dim: int) -> np.ndarray:
    """llama.cpp's rope_freqs for Llama 3 scaling (as convert_hf_to_gguf.py writes them):
    1 for short wavelengths, `factor` for long ones, a smooth blend between. [head_dim // 2]"""
    factor, low, high = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
    old_context = params["original_max_position_embeddings"]
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * math.pi / inv_freq
    smooth = (old_context / wavelen - low) / (high - low)
    blended = 1 / ((1 - smooth) / factor + smooth)
    long_or_blended = np.where(wavelen > old_context / low, factor, blended)
    return np.where(wavelen < old_context / high, 1.0, long_or_blended)


def iterate_gguf_weights(path: str, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """`(HF name, tensor)` for every weight of the GGUF file, dequantized to `dtype`, one at a
    time. Shapes are HF's: a linear weight is [out, in]. Stacked expert tensors come out per
    expert, as `model.layers.N.mlp.experts.E.gate_proj.weight` [I, H]. For llama, the q/k row
    permutation of llama.cpp is undone. rope_freqs is skipped: its scaling is in the config.

    The header is read now, so a bad file raises here rather than at the first tensor.
    """
    gguf = read_gguf(path)
    arch = _architecture(gguf)
    return _iterate_weights(gguf, arch, dtype)


def _iterate_weights(
    gguf: GGUFFile, arch: str, dtype: torch.dtype
) -> Iterator[tuple[str, torch.Tensor]]:
    for info in gguf.tensors.values():
        if info.name == _ROPE_FREQS:
            continue
        tensor = _dequantize(gguf, info)
        if arch == "llama":
            tensor = _unpermute_llama_qk(gguf, info.name, tensor)
        for name, hf_tensor in _hf_tensors(gguf, info.name, tensor):
            yield name, hf_tensor.to(dtype)


def _dequantize(gguf: GGUFFile, info: TensorInfo) -> torch.Tensor:
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


def _unpermute_llama_qk(gguf: GGUFFile, name: str, tensor: torch.Tensor) -> torch.Tensor:
    """Undo the row permutation llama.cpp's converter applies to llama's q and k projections.

    HF rotates the two halves of each head, llama.cpp adjacent pairs, so the converter reorders
    each head's rows [2, D/2] -> [D/2, 2]; this reorders them back. Rows [heads * D, ...].
    """
    heads = _required(gguf, "llama.attention.head_count")
    if ".attn_k." in name:
        heads = gguf.metadata.get("llama.attention.head_count_kv", heads)
    elif ".attn_q." not in name:
        return tensor
    shape = tensor.shape
    per_head = tensor.reshape(heads, shape[0] // heads // 2, 2, *shape[1:])
    return per_head.transpose(1, 2).reshape(shape)


def _hf_tensors(
    gguf: GGUFFile, name: str, tensor: torch.Tensor
) -> Iterator[tuple[str, torch.Tensor]]:
    """The HF name(s) of one GGUF tensor: one, or one per expert for stacked experts."""
    base, _, suffix = name.rpartition(".")
    parts = base.split(".")
    if base in _GLOBAL_NAMES:
        yield f"{_GLOBAL_NAMES[base]}.{suffix}", tensor
    elif len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        yield f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{suffix}", tensor
    elif len(parts) == 3 and parts[0] == "blk" and parts[2] in _EXPERT_NAMES:
        prefix = f"model.layers.{parts[1]}.mlp.experts"
        for expert, weight in enumerate(tensor):
            yield f"{prefix}.{expert}.{_EXPERT_NAMES[parts[2]]}.{suffix}", weight
    else:
        raise ValueError(f"{gguf.path}: tensor {name!r} has no known Hugging Face name")


def load_gguf_tokenizer(path: str) -> PreTrainedTokenizerBase:
    """The tokenizer transformers builds from the GGUF metadata (with its chat template), with
    SmolLM's digit splitting restored.

    Built by `PreTrainedTokenizerFast.from_pretrained(folder, gguf_file=...)`, not AutoTokenizer:
    for a GGUF both run the same conversion, but AutoTokenizer first re-reads the whole file with
    gguf.GGUFReader for a config it only uses to pick the class (~6 s against ~0.5 s here).

    SmolLM's own tokenizer.json splits every digit apart before the byte-level split; the GGUF
    conversion keeps only the byte-level one, so "\\n\\n1" would become ["\\n", "\\n", "1"]
    instead of ["\\n\\n", "1"]. llama.cpp marks that tokenizer with the pre-type "smollm".
    """
    gguf = read_gguf(path)
    folder, filename = os.path.split(os.path.abspath(path))
    tokenizer = PreTrainedTokenizerFast.from_pretrained(
        folder, gguf_file=filename, local_files_only=True
    )
    if gguf.metadata.get("tokenizer.ggml.pre") == _SMOLLM_PRE:
        tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    return tokenizer
