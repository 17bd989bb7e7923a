"""Row-wise ops: RMSNorm and LayerNorm (with the residual add), SiLU- and GELU-and-multiply,
GELU, rotary embedding, the greedy argmax and a LoRA slot's masked add. Each runs
pagedllm._C's kernel on CPU tensors it takes, a Triton kernel (pagedllm/_triton_ops) on
CUDA tensors where there is one, and the torch definition elsewhere."""

import torch

from pagedllm import _cpu_kernels, _torch_ops
from pagedllm._custom_ops.common import (
    _FLOAT32_OR_BF16,
    _as_dense,
    _one_float_dtype,
    cpu_kernels_apply,
    triton_kernels_apply,
)
from pagedllm.tensor_layout import with_dense_rows


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., n] * rsqrt(mean(x^2) + eps) * weight [n]."""
    if cpu_kernels_apply(x, weight, dtypes=_one_float_dtype(x)):
        return _cpu_kernels.rms_norm(with_dense_rows(x), weight.contiguous(), eps)
    if triton_kernels_apply(x, weight):
        from pagedllm._triton_ops import layernorm

        if layernorm.applies(x):
            return layernorm.rms_norm(x, weight, eps)
    return _torch_ops.rms_norm(x, weight, eps)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual); the kernel does both in one pass."""
    if cpu_kernels_apply(x, residual, weight, dtypes=_one_float_dtype(x)):
        return _cpu_kernels.fused_add_rms_norm(
            x.contiguous(), residual.contiguous(), weight.contiguous(), eps
        )
    if triton_kernels_apply(x, residual, weight) and x.shape == residual.shape:
        from pagedllm._triton_ops import layernorm

        if layernorm.applies(x):
            return layernorm.fused_add_rms_norm(x, residual, weight, eps)
    return _torch_ops.fused_add_rms_norm(x, residual, weight, eps)


def layer_norm(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float
) -> torch.Tensor:
    """F.layer_norm of x [..., n] over its last dim, with weight [n] and bias [n]."""
    if cpu_kernels_apply(x, weight, bias, dtypes=_one_float_dtype(x)):
        return _cpu_kernels.layer_norm(x.contiguous(), weight.contiguous(), bias.contiguous(), eps)
    return _torch_ops.layer_norm(x, weight, bias, eps)


def fused_add_layer_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(layer_norm(x + residual), x + residual); the kernel does both in one pass."""
    if cpu_kernels_apply(x, residual, weight, bias, dtypes=_one_float_dtype(x)):
        return _cpu_kernels.fused_add_layer_norm(
            x.contiguous(), residual.contiguous(), weight.contiguous(), bias.contiguous(), eps
        )
    return _torch_ops.fused_add_layer_norm(x, residual, weight, bias, eps)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [..., 2d] -> silu(x[..., :d]) * x[..., d:]."""
    if cpu_kernels_apply(x, dtypes=_one_float_dtype(x)):
        return _cpu_kernels.silu_and_mul(x.contiguous())
    if triton_kernels_apply(x):
        from pagedllm._triton_ops.activation import silu_and_mul as triton_silu_and_mul

        rows = x.reshape(-1, x.shape[-1]).contiguous()
        return triton_silu_and_mul(rows).view(*x.shape[:-1], x.shape[-1] // 2)
    return _torch_ops.silu_and_mul(x)


def gelu_and_mul(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """x [..., 2d] -> gelu(x[..., :d]) * x[..., d:] (approximate: "none", the erf form, or
    "tanh")."""
    if cpu_kernels_apply(x, dtypes=_one_float_dtype(x)):
        return _cpu_kernels.gelu_and_mul(x.contiguous(), approximate)
    if triton_kernels_apply(x):
        from pagedllm._triton_ops.activation import gelu_and_mul as triton_gelu_and_mul

        rows = x.reshape(-1, x.shape[-1]).contiguous()
        return triton_gelu_and_mul(rows, approximate).view(*x.shape[:-1], x.shape[-1] // 2)
    return _torch_ops.gelu_and_mul(x, approximate)


def gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """F.gelu(x) (approximate: "none", the erf form, or "tanh"), elementwise."""
    if cpu_kernels_apply(x, dtypes=_one_float_dtype(x)):
        return _cpu_kernels.gelu(x.contiguous(), approximate)
    return _torch_ops.gelu(x, approximate)


def scale(x: torch.Tensor, alpha: float) -> torch.Tensor:
    """x * alpha (a residual stream's constant scale: Granite); pagedllm._C's kernel on CPU
    tensors (a launch captured decode steps replay), torch elsewhere; the same bits."""
    if cpu_kernels_apply(x, dtypes=_one_float_dtype(x)):
        return _cpu_kernels.scale(x.contiguous(), alpha)
    return _torch_ops.scale(x, alpha)


def add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a + b of one shape and dtype (a residual add outside a fused norm: OLMo 2);
    pagedllm._C's kernel on CPU tensors, torch elsewhere; the same bits."""
    if a.shape == b.shape and cpu_kernels_apply(a, b, dtypes=_one_float_dtype(a)):
        return _cpu_kernels.add(a.contiguous(), b.contiguous())
    return _torch_ops.add(a, b)


def lora_masked_add(
    y: torch.Tensor, delta: torch.Tensor, row_slots: torch.Tensor, slot: int
) -> torch.Tensor:
    """y [T, n] + delta [T, n] on the rows t whose row_slots[t] (int32) is `slot`, y's rows
    elsewhere (lora/layers.py); pagedllm._C's kernel on CPU tensors (a launch that captured
    decode steps replay), the torch definition elsewhere, the same bits (a NaN's payload
    aside: bf16 NaNs come out canonical)."""
    if cpu_kernels_apply(y, delta, dtypes=_one_float_dtype(y)):
        return _cpu_kernels.lora_masked_add(y.contiguous(), delta.contiguous(), row_slots, slot)
    return _torch_ops.lora_masked_add(y, delta, row_slots, slot)


def rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox_style: bool,
    qk_norm: tuple[torch.Tensor, torch.Tensor, float] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """query [T, H * head_size] and key [T, KV * head_size], rotated; their rows may be
    strided (column slices of a fused qkv). cos_sin_cache [max_pos, rotary_dim] must cover
    every position (the C kernel raises ValueError, torch IndexError, if not; the Triton
    kernel does not look, as that would wait on the GPU). query and key share a dtype; the
    cache is float32.

    qk_norm (q_weight [head_size], k_weight [head_size], eps): each head is RMS-normed
    first (Qwen3's q_norm and k_norm), in the same launch on CUDA, else by rms_norm."""
    two_dims = query.dim() == key.dim() == 2
    weights = qk_norm[:2] if qk_norm is not None else ()
    if (
        two_dims
        and triton_kernels_apply(query, key, *weights)
        and cos_sin_cache.device == query.device
    ):
        from pagedllm._triton_ops.rotary import rotary_embedding as triton_rotary_embedding

        if qk_norm is not None:
            qk_norm = (qk_norm[0].contiguous(), qk_norm[1].contiguous(), qk_norm[2])
        return triton_rotary_embedding(
            positions, query, key, head_size, cos_sin_cache.float(), is_neox_style, qk_norm
        )
    if qk_norm is not None:
        q_weight, k_weight, eps = qk_norm
        query, key = (
            rms_norm(x.view(*x.shape[:-1], -1, head_size), weight, eps).view(x.shape)
            for x, weight in ((query, q_weight), (key, k_weight))
        )
    if not (
        two_dims
        and cpu_kernels_apply(query, key, dtypes=_one_float_dtype(query))
        and cpu_kernels_apply(cos_sin_cache)
    ):
        return _torch_ops.rotary_embedding(
            positions, query, key, head_size, cos_sin_cache, is_neox_style
        )
    return _cpu_kernels.rotary_embedding(
        _as_dense(positions, torch.int64),
        with_dense_rows(query),
        with_dense_rows(key),
        head_size,
        cos_sin_cache.contiguous(),
        is_neox_style,
    )


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """logits [rows, n].argmax(dim=-1), the greedy tokens: pagedllm._C's kernel for
    contiguous CPU float32 or bfloat16 rows, 4.5-5x faster than torch.argmax's walk element
    by element (csrc/argmax.c)."""
    if (
        logits.dim() == 2
        and logits.shape[1] > 0
        and logits.is_contiguous()
        and cpu_kernels_apply(logits, dtypes=_FLOAT32_OR_BF16)
    ):
        return _cpu_kernels.argmax(logits)
    return logits.argmax(dim=-1)
