"""Gemma, Gemma 2 and Gemma 3 GGUF files (llama.cpp's `gemma`, `gemma2`, `gemma3`): the config
fields llama.cpp implies rather than stores, and the norm weights its converter stores plus one.

What the file does not say, llama.cpp fixes by architecture (llama_model::load_hparams and
its graph builders), and the config here says the same (the model classes scale the
embeddings by sqrt(hidden_size), as llama.cpp does): the tanh GELU of the gated MLP, Gemma
2's window on every other layer (4096 where unstated) and its soft caps (50 on attention
scores, 30 on logits, where unstated), Gemma 3's window on five layers of every six
(`attention.sliding_window_pattern` where stated), its sliding layers rotated at theta 10000
unscaled (`rope.freq_base_swa` where stated), and the attention scale (see
query_pre_attn_scalar). No q/k rows are permuted (only llama's converter permutes them), and
the LM head is the embedding unless the file holds output.weight.
"""

from typing import Any

import numpy as np
import torch

from pagedllm.gguf.metadata import integer, positive_float
from pagedllm.gguf.reader import GGUFFile
from pagedllm.gguf.sliding import layer_types, periodic_sliding

GEMMA_LAYOUT = ("gemma", "gemma2", "gemma3")
"""Architectures whose norm weights convert_hf_to_gguf.py stores plus one."""
POST_NORM_LAYOUT = ("gemma2", "gemma3")
"""Architectures with norms after attention and around the MLP, where GGUF's ffn_norm is the
pre-MLP norm (`pre_feedforward_layernorm`), not Llama's post-attention one."""

# llama.cpp's sliding-window period (llama_hparams::set_swa_pattern: layer i slides unless
# i % period == period - 1), as transformers' layer_types for these models
_SWA_PERIODS = {"gemma2": 2, "gemma3": 6}
_GEMMA2_WINDOW = 4096
_SWA_THETA = 10000.0
# block counts of the 27B models, whose attention scale llama.cpp takes from hidden / heads
_27B_LAYERS = {"gemma2": 46, "gemma3": 62}


def gemma_kwargs(gguf: GGUFFile, arch: str, sizes: dict[str, Any]) -> dict[str, Any]:
    """The config fields of a Gemma file beyond the common ones, which `sizes` holds
    (hf_config's: the layer and head counts, head_dim, and the rope of full-attention layers
    as `rope_parameters`)."""
    # llama.cpp's LLM_FFN_GELU is ggml_gelu, the tanh approximation
    kwargs: dict[str, Any] = {"hidden_activation": "gelu_pytorch_tanh"}
    if arch == "gemma":
        return kwargs
    kwargs["query_pre_attn_scalar"] = query_pre_attn_scalar(arch, sizes)
    layers = sizes["num_hidden_layers"]
    if arch == "gemma2":
        kwargs |= _gemma2_caps(gguf, arch)
        window = integer(gguf, f"{arch}.attention.sliding_window", _GEMMA2_WINDOW)
        sliding = periodic_sliding(_SWA_PERIODS[arch], layers)
    else:
        kwargs |= _gemma3_rope_and_cap(gguf, arch, sizes["rope_parameters"])
        # no window (absent or 0): every layer attends to all, as llama.cpp runs such a file
        window = integer(gguf, f"{arch}.attention.sliding_window", 0, minimum=0)
        sliding = _gemma3_sliding_layers(gguf, arch, layers) if window else [False] * layers
    kwargs["sliding_window"] = window or None
    kwargs["layer_types"] = layer_types(sliding)
    return kwargs


def _gemma2_caps(gguf: GGUFFile, arch: str) -> dict[str, float]:
    attn, final = f"{arch}.attn_logit_softcapping", f"{arch}.final_logit_softcapping"
    return {
        "attn_logit_softcapping": positive_float(gguf, attn, 50.0),
        "final_logit_softcapping": positive_float(gguf, final, 30.0),
    }


def _gemma3_rope_and_cap(gguf: GGUFFile, arch: str, rope: dict[str, Any]) -> dict[str, Any]:
    """`rope_parameters` by layer type (global layers: `rope`), and the logits' soft cap,
    which the converter writes only where the model has one (Gemma 3 has no attention cap).
    A cap beside a sliding window is applied as transformers applies it, though llama.cpp's
    windowed Gemma 3 graph leaves it out; no released Gemma 3 has one."""
    swa_theta = positive_float(gguf, f"{arch}.rope.freq_base_swa", _SWA_THETA)
    final = f"{arch}.final_logit_softcapping"
    return {
        "rope_parameters": {
            "full_attention": rope,
            "sliding_attention": {"rope_type": "default", "rope_theta": swa_theta},
        },
        "attn_logit_softcapping": None,
        "final_logit_softcapping": positive_float(gguf, final) if final in gguf.metadata else None,
    }


def query_pre_attn_scalar(arch: str, sizes: dict[str, int]) -> int:
    """The attention scale's inverse square, which no file states: llama.cpp scales q by
    1/sqrt(head_dim), except for the 27B models (told by their block count), which by
    Google's reference use 1/sqrt(hidden_size / heads) (integer division), as their
    transformers configs' query_pre_attn_scalar say (Gemma 2 27B: 144, Gemma 3 27B: 168)."""
    if sizes["num_hidden_layers"] == _27B_LAYERS[arch]:
        return sizes["hidden_size"] // sizes["num_attention_heads"]
    return sizes["head_dim"]


def _gemma3_sliding_layers(gguf: GGUFFile, arch: str, layers: int) -> list[bool]:
    """`attention.sliding_window_pattern` as llama.cpp reads it: a period, or one bool per
    layer (true: sliding); a period of 6 where absent (convert_hf_to_gguf.py writes none)."""
    key = f"{arch}.attention.sliding_window_pattern"
    value = gguf.metadata.get(key)
    if isinstance(value, np.ndarray):
        if value.dtype != np.bool_ or value.shape != (layers,):
            raise ValueError(
                f"{gguf.path}: metadata key {key!r} is an array of {value.dtype} "
                f"{list(value.shape)}; it must be a period or one bool per layer ({layers})"
            )
        return value.tolist()
    return periodic_sliding(integer(gguf, key, _SWA_PERIODS[arch], minimum=0), layers)


def is_offset_norm(arch: str, gguf_name: str) -> bool:
    """Whether GGUF tensor `gguf_name` is a norm weight the converter stored plus one:
    convert_hf_to_gguf.py adds 1 to every `*norm.weight` of these architectures, so llama.cpp
    multiplies by the stored value where transformers multiplies by 1 + weight."""
    return arch in GEMMA_LAYOUT and gguf_name.endswith("norm.weight")


def checkpoint_norm(stored: torch.Tensor) -> torch.Tensor:
    """The checkpoint's weight w of a norm stored as s = 1 + w, in float64: s - 1 is exact
    there for every float32 s (above 2^-29 in size), and GemmaRMSNorm adds the 1 back in
    float64 (layers/layernorm.py), so the model holds s itself, exactly as llama.cpp does.
    In float32, s - 1 would round wherever s is below 0.5 (Gemma 2's and 3's post-norms)."""
    return stored.double() - 1.0
