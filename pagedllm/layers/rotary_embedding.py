"""Rotary position embeddings (RoPE) and the scaled variants used by long-context models.

`get_rope()` turns a model's rope settings into a `RotaryEmbedding` holding a float32 cos/sin
cache `[max_positions, rotary_dim]` that is indexed by each token's position. The inverse
frequencies follow transformers' `modeling_rope_utils` operation for operation, so rotations
agree with it to the last float32 bit; at position 10^5 even one ulp of difference in an
inverse frequency would move the angle by ~1e-2.
"""

import math
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from pagedllm import _custom_ops
from pagedllm.forward_context import get_max_seq_len
from pagedllm.layers.inference_module import InferenceModule
from pagedllm.layers.layernorm import RMSNorm
from pagedllm.logger import init_logger

logger = init_logger(__name__)

RopeParameters = dict[str, object]
# (inverse frequencies [rotary_dim / 2], attention scaling of cos/sin, positions to cache)
RopeSpec = tuple[torch.Tensor, float, int]


class RotaryEmbedding(InferenceModule):
    """Rotates the first `rotary_dim` channels of every head of q and k by position * inv_freq.

    `is_neox_style` pairs channel i with i + rotary_dim / 2 (rotate_half, as in HF Llama and
    Qwen); otherwise channels 2i and 2i + 1 are paired (GPT-J). The rotation itself is
    `_custom_ops.rotary_embedding`.

    The cache covers `max_position` positions from construction, every position a model of
    that config can be asked about. Forward never reads the positions tensor to check (on an
    accelerator that is a host sync per layer): it grows the cache only when the forward
    context says a step reaches further (host-side lengths), and rebuilds it when it is not
    float32 on the positions' device (after `model.to(dtype)` or a build on the meta device).
    """

    def __init__(
        self,
        head_size: int,
        rotary_dim: int,
        inv_freq: torch.Tensor,
        attention_scaling: float,
        max_position: int,
        is_neox_style: bool = True,
    ) -> None:
        super().__init__()
        assert inv_freq.shape == (rotary_dim // 2,) and inv_freq.dtype == torch.float32
        self.head_size = head_size
        self.rotary_dim = rotary_dim
        self.is_neox_style = is_neox_style
        self.attention_scaling = attention_scaling
        # A plain CPU float32 tensor, not a buffer: model.to(dtype) must not round it, as the
        # cache is rebuilt from it.
        self.inv_freq = inv_freq.cpu()
        cache = _cos_sin_cache(inv_freq, max_position, attention_scaling, None)
        self.register_buffer("cos_sin_cache", cache, persistent=False)

    def forward(
        self,
        positions: torch.Tensor,
        query: torch.Tensor,
        key: torch.Tensor,
        qk_norms: tuple[RMSNorm, RMSNorm] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [T] int64, query [T, num_heads * head_size], key [T, num_kv_heads * head_size]
        -> (query, key) rotated, in their shapes and dtypes; computed in float32.
        qk_norms: (q_norm, k_norm), RMSNorms of head_size applied to each head first
        (Qwen3's), fused with the rotation where a kernel does both."""
        self._fit_cache(positions.device)
        qk_norm = None
        if qk_norms is not None:
            q_norm, k_norm = qk_norms
            assert q_norm.eps == k_norm.eps, "one eps for q_norm and k_norm"
            qk_norm = (q_norm.weight, k_norm.weight, q_norm.eps)
        return _custom_ops.rotary_embedding(
            positions, query, key, self.head_size, self.cos_sin_cache, self.is_neox_style, qk_norm
        )

    def _fit_cache(self, device: torch.device) -> None:
        cache = self.cos_sin_cache
        size = cache.shape[0]
        needed = get_max_seq_len()
        if needed > size:
            size = max(needed, 2 * size)
        stale = cache.device != device or cache.dtype != torch.float32
        if stale or size != cache.shape[0]:
            self.cos_sin_cache = _cos_sin_cache(self.inv_freq, size, self.attention_scaling, device)

    def extra_repr(self) -> str:
        return (
            f"head_size={self.head_size}, rotary_dim={self.rotary_dim}, "
            f"max_position={self.cos_sin_cache.shape[0]}, is_neox_style={self.is_neox_style}, "
            f"attention_scaling={self.attention_scaling:g}"
        )


def _longrope(base: float, dim: int, max_position: int, params: RopeParameters) -> RopeSpec:
    """LongRoPE (Phi-3's "longrope", formerly "su"): frequencies divided per dimension by
    the short factors, or by the long ones when the engine serves sequences longer than
    original_max_position_embeddings, for every position either way (vLLM's rule, so a
    position's rotation never changes as a sequence grows: transformers switches a whole
    sequence to the long factors, recomputing its cache, once it passes that length). The
    cos/sin scale: long_mscale / short_mscale where the config states them, else its
    attention_factor, else sqrt(1 + ln(s) / ln(original)) for s = factor, or
    max_position / original, above 1."""
    original = int(_require(params, "original_max_position_embeddings", "longrope"))
    use_long = int(params["max_model_len"]) > original
    if use_long:
        logger.warning(
            "LongRoPE: its long factors for every position, as the engine serves up to %d "
            "tokens, past the original %d; max_model_len <= %d keeps the short ones",
            params["max_model_len"],
            original,
            original,
        )
    name = "long_factor" if use_long else "short_factor"
    ext = torch.tensor(params.get(name) or [], dtype=torch.float32, device="cpu")
    if ext.shape != (dim // 2,):
        raise ValueError(f"longrope {name} must list rotary_dim / 2 = {dim // 2} numbers")
    shape = torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim
    inv_freq = 1.0 / (ext * base**shape)
    scale = params.get("long_mscale" if use_long else "short_mscale")
    if scale is None:
        scale = params.get("attention_factor")
    if scale is None:
        factor = float(params.get("factor") or max_position / original)
        scale = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
    return inv_freq, float(scale), max_position


def _cos_sin_cache(
    inv_freq: torch.Tensor,
    num_positions: int,
    attention_scaling: float,
    device: torch.device | None,
) -> torch.Tensor:
    """[num_positions, rotary_dim]: cos of every angle, then sin, times attention_scaling."""
    t = torch.arange(num_positions, dtype=torch.float, device=device)
    freqs = t[:, None] * inv_freq.to(t.device)  # [N, rotary_dim / 2]
    return torch.cat((freqs.cos() * attention_scaling, freqs.sin() * attention_scaling), dim=-1)


def _base_freqs(base: float, dim: int) -> torch.Tensor:
    """base^(2i / dim) for i < dim / 2, on the CPU in float32: the wavelengths / 2 pi."""
    return base ** (torch.arange(0, dim, 2, dtype=torch.float, device="cpu") / dim)


def _require(params: RopeParameters, name: str, rope_type: str) -> float:
    if params.get(name) is None:
        raise ValueError(f"rope type {rope_type!r} needs {name!r} in rope_scaling, got {params}")
    return float(params[name])


def _original_max_position(params: RopeParameters, max_position: int) -> int:
    return int(params.get("original_max_position_embeddings") or max_position)


def _default(base: float, dim: int, max_position: int, params: RopeParameters) -> RopeSpec:
    return 1.0 / _base_freqs(base, dim), 1.0, max_position


def _linear(base: float, dim: int, max_position: int, params: RopeParameters) -> RopeSpec:
    """Position interpolation: every frequency divided by factor."""
    factor = _require(params, "factor", "linear")
    return 1.0 / _base_freqs(base, dim) / factor, 1.0, int(max_position * factor)


def _dynamic_ntk(base: float, dim: int, max_position: int, params: RopeParameters) -> RopeSpec:
    """NTK-aware scaling of the base, fixed at its value for seq_len = max_position * factor
    (the model's max_model_len, config.derive_max_model_len).

    transformers recomputes the base from the current sequence length (unscaled up to
    max_position), so a token's rotation changes as the sequence grows. A paged KV cache
    stores keys already rotated, so each position needs one fixed rotation; as vLLM does, the
    base is the longest sequence's. Outputs therefore differ from transformers' for every
    sequence shorter than max_position * factor tokens, and match at that length.
    """
    factor = _require(params, "factor", "dynamic")
    seq_len = int(max_position * factor)
    base = base * (factor * seq_len / max_position - (factor - 1)) ** (dim / (dim - 2))
    return 1.0 / _base_freqs(base, dim), 1.0, seq_len


def _llama3(base: float, dim: int, max_position: int, params: RopeParameters) -> RopeSpec:
    """Llama 3.1: low frequencies divided by factor, high ones kept, a smooth ramp between."""
    factor = _require(params, "factor", "llama3")
    low_freq_factor = _require(params, "low_freq_factor", "llama3")
    high_freq_factor = _require(params, "high_freq_factor", "llama3")
    old_context_len = _original_max_position(params, max_position)
    inv_freq = 1.0 / _base_freqs(base, dim)
    wavelen = 2 * math.pi / inv_freq
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    inv_freq = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, smoothed, inv_freq), 1.0, max_position


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _yarn_attention_factor(factor: float, params: RopeParameters) -> float:
    """attention_factor if given, else mscale ratio (DeepSeek) if both given, else the paper's."""
    if params.get("attention_factor") is not None:
        return float(params["attention_factor"])
    mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
    if mscale and mscale_all_dim:
        return _yarn_mscale(factor, float(mscale)) / _yarn_mscale(factor, float(mscale_all_dim))
    return _yarn_mscale(factor)


def _yarn_ramp(params: RopeParameters, base: float, dim: int, original: int) -> torch.Tensor:
    """[dim / 2] in [0, 1]: 0 for the dims that rotate more than beta_fast times over the
    original context (kept), 1 for those under beta_slow times (interpolated)."""

    def correction_dim(num_rotations: float) -> float:
        return dim * math.log(original / (num_rotations * 2 * math.pi)) / (2 * math.log(base))

    low = correction_dim(float(params.get("beta_fast") or 32))
    high = correction_dim(float(params.get("beta_slow") or 1))
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = (torch.arange(dim // 2, dtype=torch.float32, device="cpu") - low) / (high - low)
    return torch.clamp(ramp, 0, 1)


def _yarn(base: float, dim: int, max_position: int, params: RopeParameters) -> RopeSpec:
    """YaRN: NTK-by-parts interpolation plus a cos/sin (hence attention) scale."""
    original = _original_max_position(params, max_position)
    factor = float(params.get("factor") or max_position / original)
    pos_freqs = _base_freqs(base, dim)
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (factor * pos_freqs)
    keep = 1 - _yarn_ramp(params, base, dim, original)
    inv_freq = interpolation * (1 - keep) + extrapolation * keep
    num_positions = max(max_position, int(original * factor))
    return inv_freq, _yarn_attention_factor(factor, params), num_positions


_ROPE_INIT_FUNCTIONS: dict[str, Callable[[float, int, int, RopeParameters], RopeSpec]] = {
    "default": _default,
    "linear": _linear,
    "dynamic": _dynamic_ntk,
    "llama3": _llama3,
    "yarn": _yarn,
    "longrope": _longrope,
}

_max_model_len: int | None = None


@contextmanager
def use_max_model_len(max_model_len: int | None) -> Iterator[None]:
    """Rotary embeddings built inside serve sequences of up to max_model_len tokens (None:
    max_position_embeddings), which picks LongRoPE's factors (build_model sets it)."""
    global _max_model_len
    previous, _max_model_len = _max_model_len, max_model_len
    try:
        yield
    finally:
        _max_model_len = previous


def served_max_model_len() -> int | None:
    """The max_model_len of the model being built (use_max_model_len's; None outside it)."""
    return _max_model_len


# Weak: an engine's layers hold their embedding, and it (with its cos/sin cache on the
# device) goes with the last model that uses it, not with the process.
_ROPE_DICT: "weakref.WeakValueDictionary[tuple, RotaryEmbedding]" = weakref.WeakValueDictionary()


def _check_dims(head_size: int, rotary_dim: int) -> None:
    if not 0 < rotary_dim <= head_size or rotary_dim % 2 != 0:
        raise ValueError(
            f"rotary_dim must be even and in [2, head_size={head_size}], got {rotary_dim}"
        )


def _hashable(params: RopeParameters) -> tuple:
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in params.items()))


def get_rope(
    head_size: int,
    rotary_dim: int,
    max_position: int,
    base: float,
    rope_scaling: dict | None = None,
    is_neox_style: bool = True,
) -> RotaryEmbedding:
    """The RotaryEmbedding for a config's rope settings.

    `rope_scaling` is HF's dict (`rope_scaling` in transformers 4.x, `rope_parameters` in 5.x);
    its type is read from `rope_type` or `type`; its `rope_theta` and `partial_rotary_factor`
    are ignored, as `base` and `rotary_dim` carry them. `max_position` is the config's
    max_position_embeddings. Layers asking for the same settings share one instance and its
    cache, as in vLLM.
    """
    _check_dims(head_size, rotary_dim)
    params = dict(rope_scaling or {})
    rope_type = params.get("rope_type") or params.get("type") or "default"
    rope_type = "longrope" if rope_type == "su" else rope_type
    if rope_type not in _ROPE_INIT_FUNCTIONS:
        raise ValueError(
            f"rope type {rope_type!r} is not supported; supported: {sorted(_ROPE_INIT_FUNCTIONS)}"
        )
    if rope_type == "longrope":
        params["max_model_len"] = _max_model_len or max_position
    key = (head_size, rotary_dim, max_position, base, is_neox_style, _hashable(params))
    key += (torch.get_default_device(),)
    rope = _ROPE_DICT.get(key)
    if rope is None:
        inv_freq, scaling, num_positions = _ROPE_INIT_FUNCTIONS[rope_type](
            base, rotary_dim, max_position, params
        )
        rope = RotaryEmbedding(
            head_size, rotary_dim, inv_freq, scaling, num_positions, is_neox_style
        )
        _ROPE_DICT[key] = rope
    return rope


def get_nope(head_size: int, max_position: int) -> RotaryEmbedding:
    """The rotary embedding of a layer without rope (a NoPE layer): it turns the first channel
    pair of each head by angle 0, so q and k come out with the values they went in with (each
    head normed first where q/k norms are given). It still runs the rotary kernel, whose
    launch a captured CPU decode step replays and whose outputs are contiguous, as the
    attention kernels take them; skipped, q would stay a strided view of the fused qkv
    projection, which the attention copies with torch (executor/cpu_graph.py then runs
    those steps eagerly). Its cos/sin cache holds one pair per position."""
    key = ("nope", head_size, max_position, torch.get_default_device())
    rope = _ROPE_DICT.get(key)
    if rope is None:
        zero = torch.zeros(1, dtype=torch.float32, device="cpu")
        rope = RotaryEmbedding(head_size, 2, zero, 1.0, max_position)
        _ROPE_DICT[key] = rope
    return rope
