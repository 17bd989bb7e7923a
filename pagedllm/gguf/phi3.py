"""Phi-3 GGUF files (llama.cpp's `phi3`: Phi-3 / 3.5 mini and medium, Phi-4, Phi-4-mini): the
config fields of transformers' Phi3Config that the file states in llama.cpp's terms.

convert_hf_to_gguf.py's Phi3MiniModel writes the checkpoint's fused tensors as they are
(`attn_qkv`: q, k then v rows; `ffn_up`: gate then up rows, which llama.cpp's SwiGLU splits
in that order), no q/k rows permuted; `rope.dimension_count` is the rotary width, not the
head (head_dim is `attention.key_length` or hidden / heads, as llama.cpp takes it);
`rope.scaling.original_context_length` is the pretrained length. LongRoPE's factors are two
F32 tensors, `rope_factors_long` and `rope_factors_short` [rotary / 2], not metadata, and its
cos/sin scale is `rope.scaling.attn_factor`, which the converter computes
(sqrt(1 + ln(s) / ln(original)) for s = context / original) and llama.cpp applies to both
sets (1 where absent). llama.cpp takes the long factors for every position when its context
exceeds the original length, as pagedllm/layers/rotary_embedding.py's `_longrope` does when
max_model_len does. Phi-4 has no factors (and `attention.sliding_window` 0: no window).

`attention.sliding_window` becomes the config's `sliding_window` on every layer, as
transformers applies the checkpoint's, although llama.cpp runs phi3 without a window.
"""

from typing import Any

from pagedllm.gguf.metadata import integer, positive_float
from pagedllm.gguf.reader import GGUFFile, read_tensor
from pagedllm.gguf.rotary import rotary_width

PHI3 = "phi3"
ROPE_FACTORS = {
    "long_factor": "rope_factors_long.weight",
    "short_factor": "rope_factors_short.weight",
}
"""LongRoPE's factor tensors (transformers' rope_parameters key -> GGUF tensor name)."""
_SCALING_KEYS = ("rope.scaling.factor", "rope.scale_linear")


def phi3_kwargs(gguf: GGUFFile, arch: str, sizes: dict[str, Any]) -> dict[str, Any]:
    """The config fields of a Phi-3 file beyond the common ones, which `sizes` holds
    (hf_config's: the head counts, head_dim and max_position_embeddings), rope_parameters
    among them."""
    if "blk.0.ffn_gate_inp.weight" in gguf.tensors:
        raise ValueError(f"{gguf.path}: a phi3 file with experts (ffn_gate_inp) is not supported")
    head_dim = sizes["head_dim"]
    rotary = rotary_width(gguf, arch, head_dim)
    context = sizes["max_position_embeddings"]
    original = integer(gguf, f"{arch}.rope.scaling.original_context_length", context)
    window = integer(gguf, f"{arch}.attention.sliding_window", 0, minimum=0)
    return {
        "partial_rotary_factor": rotary / head_dim,
        "original_max_position_embeddings": original,
        "rope_parameters": _rope_parameters(gguf, arch, rotary, original),
        "sliding_window": window or None,
    }


def _rope_parameters(gguf: GGUFFile, arch: str, rotary: int, original: int) -> dict[str, Any]:
    """LongRoPE where the file holds its factors, else plain rope; ValueError for a scaling
    factor (llama.cpp would scale linearly, which Phi3Config cannot say), for one factor
    tensor without the other, and for an attn_factor without factors."""
    _refuse_scaling_factor(gguf, arch)
    theta = positive_float(gguf, f"{arch}.rope.freq_base", 10000.0)  # llama.cpp's default
    attn_factor = positive_float(gguf, f"{arch}.rope.scaling.attn_factor", 1.0)
    held = [name for name in ROPE_FACTORS.values() if name in gguf.tensors]
    if not held:
        if attn_factor != 1.0:
            raise ValueError(
                f"{gguf.path}: {arch}.rope.scaling.attn_factor {attn_factor} without "
                f"LongRoPE factors is not supported"
            )
        return {"rope_type": "default", "rope_theta": theta}
    if len(held) == 1:
        raise ValueError(f"{gguf.path} holds {held[0]} without the other LongRoPE factors")
    return {
        "rope_type": "longrope",
        "rope_theta": theta,
        **{key: _factors(gguf, name, rotary) for key, name in ROPE_FACTORS.items()},
        "original_max_position_embeddings": original,
        "attention_factor": attn_factor,
    }


def _refuse_scaling_factor(gguf: GGUFFile, arch: str) -> None:
    if gguf.metadata.get(f"{arch}.rope.scaling.type") == "none":
        return
    for key in (f"{arch}.{k}" for k in _SCALING_KEYS):
        if gguf.metadata.get(key, 0) != 0:
            raise ValueError(
                f"{gguf.path}: {key} {gguf.metadata[key]!r} scales phi3's rope, which only "
                "LongRoPE's factor tensors may; it is not supported"
            )


def _factors(gguf: GGUFFile, name: str, rotary: int) -> list[float]:
    info = gguf.tensors[name]
    if info.shape != (rotary // 2,):
        raise ValueError(
            f"{gguf.path}: tensor {name} has shape {list(info.shape)}; LongRoPE needs one "
            f"factor per rotary frequency, [{rotary // 2}] (rope.dimension_count / 2)"
        )
    return read_tensor(gguf, info).tolist()
