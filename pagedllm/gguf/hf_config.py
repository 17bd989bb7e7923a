"""The transformers config that a GGUF file's metadata describes (a GGUF has no config.json)."""

import math
from typing import Any

import numpy as np
from transformers import AutoConfig, PretrainedConfig

from pagedllm.gguf.ernie4_5 import ERNIE4_5, ernie4_5_kwargs
from pagedllm.gguf.exaone4 import EXAONE4, exaone4_kwargs
from pagedllm.gguf.gemma import GEMMA_LAYOUT, gemma_kwargs
from pagedllm.gguf.glm4 import GLM4, glm4_kwargs
from pagedllm.gguf.metadata import integer, positive_float, string
from pagedllm.gguf.moe import GRANITEMOE, OLMOE, QWEN2MOE, experts_used, moe_kwargs
from pagedllm.gguf.olmo2 import OLMO2, OLMO3, is_olmo3, olmo3_kwargs
from pagedllm.gguf.phi3 import PHI3, ROPE_FACTORS, phi3_kwargs
from pagedllm.gguf.reader import GGUFFile, TensorInfo, read_gguf, read_tensor
from pagedllm.gguf.starcoder2 import STARCODER2, starcoder2_kwargs
from pagedllm.gguf.tensor_shapes import check_tensor_shapes

# GGUF architecture -> (transformers model_type, the `architectures` entry of its config)
_ARCHITECTURES = {
    ERNIE4_5: ("ernie4_5", "Ernie4_5ForCausalLM"),
    EXAONE4: ("exaone4", "Exaone4ForCausalLM"),
    "gemma": ("gemma", "GemmaForCausalLM"),
    "gemma2": ("gemma2", "Gemma2ForCausalLM"),
    "gemma3": ("gemma3_text", "Gemma3ForCausalLM"),
    GLM4: ("glm4", "Glm4ForCausalLM"),
    "granite": ("granite", "GraniteForCausalLM"),
    GRANITEMOE: ("granitemoe", "GraniteMoeForCausalLM"),
    "llama": ("llama", "LlamaForCausalLM"),
    OLMO2: ("olmo2", "Olmo2ForCausalLM"),
    OLMOE: ("olmoe", "OlmoeForCausalLM"),
    "phi3": ("phi3", "Phi3ForCausalLM"),
    "qwen2": ("qwen2", "Qwen2ForCausalLM"),
    QWEN2MOE: ("qwen2_moe", "Qwen2MoeForCausalLM"),
    "qwen3": ("qwen3", "Qwen3ForCausalLM"),
    "qwen3moe": ("qwen3_moe", "Qwen3MoeForCausalLM"),
    "smollm3": ("smollm3", "SmolLM3ForCausalLM"),
    STARCODER2: ("starcoder2", "Starcoder2ForCausalLM"),
}
LLAMA_EXPERTS = ("mixtral", "MixtralForCausalLM")
"""llama.cpp writes Mixtral as llama with experts (`llama.expert_count`, ffn_*_exps)."""
LLAMA_LAYOUT = ("llama", "granite", "smollm3")
"""Architectures llama.cpp's converter writes as llama (Granite's and SmolLM3's converters are
Llama's): q/k rows permuted, ffn biases where the model has them."""
PARTIAL_ROTARY = (PHI3, GLM4)
"""Architectures whose `rope.dimension_count` is the rotary width, part of the head."""
# Qwen2 always has q/k/v biases (Qwen2-MoE: always, or `qkv_bias`, moe.py), StarCoder 2's
# `use_bias` covers every layer (starcoder2.py)
_NO_ATTENTION_BIAS_FIELD = ("qwen2", QWEN2MOE, STARCODER2)
# llama.cpp's smollm3 (llama_model::load_hparams, n_no_rope_layer_step): layer i rotates
# unless (i + 1) % 4 == 0, which no key states; SmolLM3Config's no_rope_layer_interval
_SMOLLM3_NO_ROPE_INTERVAL = 4
# the Llama 3 rope scaling this holds is rebuilt into the config (see _llama3_rope_scaling)
ROPE_FREQS = "rope_freqs.weight"
CONFIG_TENSORS = frozenset((ROPE_FREQS, *ROPE_FACTORS.values()))
"""Tensors the config holds (rope scaling), which are no weights of the model."""

# Every Llama 3.1-3.3 model's rope scaling, apart from the factor.
_LLAMA3_ROPE = {
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


# transformers classes whose checkpoints llama.cpp's converter writes under another class's
# architecture (its LlamaModel converts Mistral and Mixtral; Olmo2Model converts OLMo 3)
_WRITTEN_AS = {"MistralForCausalLM": "llama", LLAMA_EXPERTS[1]: "llama", OLMO3[1]: OLMO2}


def gguf_architecture(hf_architecture: str) -> str | None:
    """The `general.architecture` llama.cpp gives files of the transformers class
    `hf_architecture` (LlamaForCausalLM -> llama), None for a class it has none for here."""
    for arch, (_, model_class) in _ARCHITECTURES.items():
        if model_class == hf_architecture:
            return arch
    return _WRITTEN_AS.get(hf_architecture)


def architecture(gguf: GGUFFile) -> str:
    """The file's `general.architecture`; ValueError naming it unless it is supported."""
    arch = gguf.metadata.get("general.architecture")
    if arch not in _ARCHITECTURES:
        raise ValueError(
            f"{gguf.path}: GGUF architecture {arch!r} is not supported; "
            f"supported: {sorted(_ARCHITECTURES)}"
        )
    return arch


def load_gguf_config(path: str) -> PretrainedConfig:
    """The transformers config that the GGUF metadata describes (a GGUF has no config.json)."""
    return _config(read_gguf(path))


def _config(gguf: GGUFFile) -> PretrainedConfig:
    """Every value is type-checked where it is read, and every tensor's shape is checked
    against the result before anything is built from it (see tensor_shapes.py)."""
    arch = architecture(gguf)
    model_type, model_class = _model_class(gguf, arch)
    kwargs = {"architectures": [model_class], **_sizes(gguf, arch)}
    if arch != STARCODER2:  # LayerNorms, whose epsilon starcoder2_kwargs reads
        kwargs["rms_norm_eps"] = positive_float(gguf, f"{arch}.attention.layer_norm_rms_epsilon")
    kwargs |= {
        "max_position_embeddings": integer(gguf, f"{arch}.context_length"),
        # the embedding's rows, which the weights need; llama.cpp pads the token list to match
        "vocab_size": _required_tensor(gguf, "token_embd.weight").shape[0],
        # llama.cpp writes output.weight only when it is not the embedding matrix
        "tie_word_embeddings": "output.weight" not in gguf.tensors,
        **_token_ids(gguf),
    }
    if arch == PHI3:  # see phi3.py
        kwargs |= phi3_kwargs(gguf, arch, kwargs)
    else:
        kwargs["rope_parameters"] = _rope_parameters(gguf, arch, kwargs["head_dim"])
    if arch not in _NO_ATTENTION_BIAS_FIELD:
        kwargs["attention_bias"] = "blk.0.attn_q.bias" in gguf.tensors
    if arch in LLAMA_LAYOUT:  # llama.cpp loads the ffn biases of llama where present
        kwargs["mlp_bias"] = "blk.0.ffn_up.bias" in gguf.tensors
    kwargs |= _family_kwargs(gguf, arch, model_type, kwargs)
    config = AutoConfig.for_model(model_type, **kwargs)
    check_tensor_shapes(gguf, arch, config)
    return config


def _sizes(gguf: GGUFFile, arch: str) -> dict[str, int]:
    heads = integer(gguf, f"{arch}.attention.head_count")
    kv_heads = integer(gguf, f"{arch}.attention.head_count_kv", heads)
    if heads % kv_heads:
        raise ValueError(
            f"{gguf.path}: {arch}.attention.head_count {heads} is not a multiple of "
            f"{arch}.attention.head_count_kv {kv_heads}"
        )
    hidden_size = integer(gguf, f"{arch}.embedding_length")
    sizes = {
        "hidden_size": hidden_size,
        "num_hidden_layers": integer(gguf, f"{arch}.block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": _head_dim(gguf, arch, hidden_size // heads),
    }
    if f"{arch}.feed_forward_length" in gguf.metadata:  # absent from some all-expert files
        sizes["intermediate_size"] = integer(gguf, f"{arch}.feed_forward_length", minimum=0)
    return sizes


def _family_kwargs(
    gguf: GGUFFile, arch: str, model_type: str, sizes: dict[str, Any]
) -> dict[str, Any]:
    """The config fields of one family beyond the common ones (sizes: those read so far);
    each family's module says what llama.cpp reads or implies."""
    if arch == "granite":
        return _granite_scales(gguf, arch)
    if arch == GRANITEMOE:
        return _granite_scales(gguf, arch) | moe_kwargs(gguf, arch, sizes["num_hidden_layers"])
    if arch == "smollm3":  # llama.cpp's smollm3 graph has no sliding window
        return {"no_rope_layer_interval": _SMOLLM3_NO_ROPE_INTERVAL, "use_sliding_window": False}
    if arch in GEMMA_LAYOUT:
        return gemma_kwargs(gguf, arch, sizes)
    if arch == "qwen3moe":
        return _moe_kwargs(gguf, arch)
    if arch in (QWEN2MOE, OLMOE):
        return moe_kwargs(gguf, arch, sizes["num_hidden_layers"])
    if model_type == LLAMA_EXPERTS[0]:
        return _mixtral_kwargs(gguf, arch)
    if model_type == OLMO3[0]:
        return olmo3_kwargs(gguf, arch, sizes)
    if arch == GLM4:
        return glm4_kwargs(gguf, arch, sizes)
    if arch == STARCODER2:
        return starcoder2_kwargs(gguf, arch)
    if arch == ERNIE4_5:
        return ernie4_5_kwargs(gguf)
    if arch == EXAONE4:
        return exaone4_kwargs(gguf, arch, sizes)
    return {}


def _model_class(gguf: GGUFFile, arch: str) -> tuple[str, str]:
    """transformers' model_type and class of the file: its architecture's, but Mixtral for
    a llama file with experts and OLMo 3 for an olmo2 file with a sliding window."""
    if _llama_experts(gguf, arch):
        return LLAMA_EXPERTS
    if arch == OLMO2 and is_olmo3(gguf, arch):
        return OLMO3
    return _ARCHITECTURES[arch]


def _granite_scales(gguf: GGUFFile, arch: str) -> dict[str, float]:
    """Granite's (and Granite MoE's) four multipliers, under the names llama.cpp's converter
    gives them."""
    return {
        "embedding_multiplier": positive_float(gguf, f"{arch}.embedding_scale"),
        "residual_multiplier": positive_float(gguf, f"{arch}.residual_scale"),
        "attention_multiplier": positive_float(gguf, f"{arch}.attention.scale"),
        "logits_scaling": positive_float(gguf, f"{arch}.logit_scale"),
    }


def _token_ids(gguf: GGUFFile) -> dict[str, int | None]:
    ids = {}
    for field, key in (("bos", "bos"), ("eos", "eos"), ("pad", "padding")):
        name = f"tokenizer.ggml.{key}_token_id"
        ids[f"{field}_token_id"] = integer(gguf, name, minimum=0) if name in gguf.metadata else None
    return ids


def _required_tensor(gguf: GGUFFile, name: str) -> TensorInfo:
    if name not in gguf.tensors:
        raise ValueError(f"{gguf.path} has no tensor {name!r}")
    return gguf.tensors[name]


def _head_dim(gguf: GGUFFile, arch: str, default: int) -> int:
    """`attention.key_length` where written; else the rotary width, which is the whole head in
    every architecture here but PARTIAL_ROTARY's; else hidden_size / heads."""
    keys = [f"{arch}.attention.key_length"]
    if arch not in PARTIAL_ROTARY:
        keys.append(f"{arch}.rope.dimension_count")
    for key in keys:
        if key in gguf.metadata:
            return integer(gguf, key)
    return default


def _moe_kwargs(gguf: GGUFFile, arch: str) -> dict[str, Any]:
    experts = integer(gguf, f"{arch}.expert_count")
    return {
        "num_experts": experts,
        "num_experts_per_tok": experts_used(gguf, arch, experts),
        "moe_intermediate_size": integer(gguf, f"{arch}.expert_feed_forward_length"),
        # llama.cpp renormalizes the top-k routing weights of qwen3moe; the file does not say so
        "norm_topk_prob": True,
    }


def _llama_experts(gguf: GGUFFile, arch: str) -> bool:
    """Whether a llama file holds experts (Mixtral): its `llama.expert_count` above 0, which
    a file with a router (ffn_gate_inp) must state."""
    if arch != "llama":
        return False
    experts = integer(gguf, f"{arch}.expert_count", 0, minimum=0)
    if not experts and "blk.0.ffn_gate_inp.weight" in gguf.tensors:
        raise ValueError(
            f"{gguf.path}: a llama file with experts (blk.0.ffn_gate_inp) must state "
            f"{arch}.expert_count"
        )
    return experts > 0


def _mixtral_kwargs(gguf: GGUFFile, arch: str) -> dict[str, Any]:
    """A llama file's experts as MixtralConfig's fields, each of `feed_forward_length` as
    llama.cpp sizes them (required: MixtralConfig's default is 8x7B's). llama.cpp routes
    them as Mixtral: a softmax over all experts, the top k renormalized."""
    experts = integer(gguf, f"{arch}.expert_count")
    return {
        "num_local_experts": experts,
        "num_experts_per_tok": experts_used(gguf, arch, experts),
        "intermediate_size": integer(gguf, f"{arch}.feed_forward_length"),
    }


def _rope_parameters(gguf: GGUFFile, arch: str, head_dim: int) -> dict[str, Any]:
    """transformers' `rope_parameters`: theta, and the scaling the file describes, read as
    llama.cpp reads it (llama_model::load_hparams): the type defaults to linear, the factor is
    `rope.scaling.factor` or else the older `rope.scale_linear`, and a factor of 0 or none
    means no scaling, whatever the type. `rope.scaling.attn_factor` (default 1) multiplies
    YaRN's cos/sin scale: transformers' `attention_factor` (which replaces that scale) is
    their product; pagedllm supports it on YaRN only."""
    theta = positive_float(gguf, f"{arch}.rope.freq_base", 10000.0)  # llama.cpp's default
    attn_factor = positive_float(gguf, f"{arch}.rope.scaling.attn_factor", 1.0)
    params: dict[str, Any] = {"rope_type": "default", "rope_theta": theta}
    scaling = string(gguf, f"{arch}.rope.scaling.type", "linear")
    if scaling not in ("none", "linear", "yarn"):
        raise ValueError(
            f"{gguf.path}: rope scaling type {scaling!r} is not supported; "
            "supported: 'none', 'linear', 'yarn'"
        )
    factor = _rope_factor(gguf, arch)
    if scaling != "none" and factor is not None:
        params |= {"rope_type": scaling, "factor": factor}
        if scaling == "yarn":
            original = integer(gguf, f"{arch}.rope.scaling.original_context_length")
            params["original_max_position_embeddings"] = original
            if attn_factor != 1.0:
                params["attention_factor"] = attn_factor * _yarn_mscale(factor)
    if ROPE_FREQS in gguf.tensors:
        params |= _llama3_rope_scaling(gguf, theta, head_dim)
    if attn_factor != 1.0 and "attention_factor" not in params:
        raise ValueError(
            f"{gguf.path}: {arch}.rope.scaling.attn_factor {attn_factor} scales the rotary "
            f"embedding of {params['rope_type']!r} rope; pagedllm supports it on yarn only"
        )
    return params


def _yarn_mscale(factor: float) -> float:
    """The cos/sin scale llama.cpp gives YaRN before attn_factor (llama_context's
    `get_mscale(factor, 1)`; ggml's rope_yarn multiplies back the 0.1 ln(factor) + 1 that
    llama_context divides out), as transformers' default for YaRN."""
    return 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0


def _rope_factor(gguf: GGUFFile, arch: str) -> float | None:
    for key in (f"{arch}.rope.scaling.factor", f"{arch}.rope.scale_linear"):
        value = gguf.metadata.get(key)
        if isinstance(value, (int, float)) and value == 0:  # llama.cpp: no scaling
            return None
        if value is not None:
            return positive_float(gguf, key)
    return None


def _llama3_rope_scaling(gguf: GGUFFile, theta: float, head_dim: int) -> dict[str, Any]:
    """Llama 3 rope scaling, which llama.cpp keeps only as the tensor rope_freqs: one divisor
    per rotary frequency, not the four parameters. Rather than fit them, take every Llama 3.x
    model's values with the largest divisor as the factor, and check they rebuild the tensor."""
    divisors = read_tensor(gguf, gguf.tensors[ROPE_FREQS]).numpy()
    params = {"rope_type": "llama3", "factor": float(divisors.max()), **_LLAMA3_ROPE}
    expected = _llama3_divisors(params, theta, head_dim)
    if expected.shape != divisors.shape or not np.allclose(expected, divisors, rtol=1e-5):
        raise ValueError(
            f"{gguf.path}: {ROPE_FREQS} is not Llama 3 rope scaling with {params}; "
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
