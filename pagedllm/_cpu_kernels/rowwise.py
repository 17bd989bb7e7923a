"""The kernels that work row by row, float32 or bfloat16: RMSNorm and LayerNorm (plain and
fused with the residual add), SiLU-and-mul, GELU-and-mul and GELU, rotary embedding, dtype
conversion, argmax, a LoRA slot's masked add, and the elementwise scale and add of residual
streams."""

import math

import torch

from pagedllm._cpu_kernels.boundary import Flag, Float, Int, Kernel, Output, Tensor, require
from pagedllm._cpu_kernels.flags import (
    FLOAT_TYPE,
    GELU_APPROXIMATE,
    FloatType,
    GeluApproximate,
    RotaryStyle,
)

_F32, _BF16, _I32, _I64 = torch.float32, torch.bfloat16, torch.int32, torch.int64

RMS_NORM = Kernel(
    "rms_norm",
    Output("out"),
    Tensor("x", "[..., n]", "float", rows=True),
    Tensor("weight", "[n], n = x's last dim", "float"),
    Flag("dtype", FloatType),
    Float("eps"),
    Int("rows"),
    Int("n"),
    Int("group"),
    Int("group_stride"),
    Int("num_threads"),
)
FUSED_ADD_RMS_NORM = Kernel(
    "fused_add_rms_norm",
    Output("out"),
    Output("residual_out"),
    Tensor("x", "[..., n]", "float"),
    Tensor("residual", "[..., n] like x", "float"),
    Tensor("weight", "[n], n = x's last dim", "float"),
    Flag("dtype", FloatType),
    Float("eps"),
    Int("rows"),
    Int("n"),
    Int("num_threads"),
)
LAYER_NORM = Kernel(
    "layer_norm",
    Output("out"),
    Tensor("x", "[..., n]", "float"),
    Tensor("weight", "[n], n = x's last dim", "float"),
    Tensor("bias", "[n], n = x's last dim", "float"),
    Flag("dtype", FloatType),
    Float("eps"),
    Int("rows"),
    Int("n"),
    Int("num_threads"),
)
FUSED_ADD_LAYER_NORM = Kernel(
    "fused_add_layer_norm",
    Output("out"),
    Output("residual_out"),
    Tensor("x", "[..., n]", "float"),
    Tensor("residual", "[..., n] like x", "float"),
    Tensor("weight", "[n], n = x's last dim", "float"),
    Tensor("bias", "[n], n = x's last dim", "float"),
    Flag("dtype", FloatType),
    Float("eps"),
    Int("rows"),
    Int("n"),
    Int("num_threads"),
)
ROTARY_EMBEDDING = Kernel(
    "rotary_embedding",
    Tensor("positions", "[T]", _I64),
    Tensor("query", "[T, num_heads * head_size]", "float", rows=True),
    Tensor("key", "[T, num_kv_heads * head_size]", "float", rows=True),
    Output("query_out"),
    Output("key_out"),
    Flag("dtype", FloatType),
    Int("q_stride"),
    Int("k_stride"),
    Int("num_tokens"),
    Int("num_heads"),
    Int("num_kv_heads"),
    Int("head_size"),
    Int("rot_dim"),
    Tensor("cos_sin_cache", "[max_position, rotary_dim]", _F32),
    Flag("style", RotaryStyle),
    Int("num_threads"),
    Int("num_positions"),
)
SILU_AND_MUL = Kernel(
    "silu_and_mul",
    Output("out"),
    Tensor("x", "[..., 2d]", "float"),
    Flag("dtype", FloatType),
    Int("num_tokens"),
    Int("d"),
    Int("num_threads"),
)
GELU_AND_MUL = Kernel(
    "gelu_and_mul",
    Output("out"),
    Tensor("x", "[..., 2d]", "float"),
    Flag("dtype", FloatType),
    Flag("approximate", GeluApproximate),
    Int("num_tokens"),
    Int("d"),
    Int("num_threads"),
)
GELU = Kernel(
    "gelu",
    Output("out"),
    Tensor("x", "[...]", "float"),
    Flag("dtype", FloatType),
    Flag("approximate", GeluApproximate),
    Int("n"),
    Int("num_threads"),
)
LORA_MASKED_ADD = Kernel(
    "lora_masked_add",
    Output("out"),
    Tensor("y", "[T, n]", "float"),
    Tensor("delta", "[T, n] like y", "float"),
    Tensor("row_slots", "[T]", _I32),
    Int("slot"),
    Flag("dtype", FloatType),
    Int("rows"),
    Int("n"),
    Int("num_threads"),
)
SCALE = Kernel(
    "scale",
    Output("out"),
    Tensor("x", "[...]", "float"),
    Float("alpha"),
    Flag("dtype", FloatType),
    Int("n"),
    Int("num_threads"),
)
ADD = Kernel(
    "add",
    Output("out"),
    Tensor("a", "[...]", "float"),
    Tensor("b", "[...] like a", "float"),
    Flag("dtype", FloatType),
    Int("n"),
    Int("num_threads"),
)
CONVERT = Kernel(
    "convert",
    Output("out"),
    Flag("out_dtype", FloatType),
    Tensor("x", "[...]", "float"),
    Flag("dtype", FloatType),
    Int("n"),
)
ARGMAX = Kernel(
    "argmax",
    Output("out"),
    Tensor("x", "[rows, n]", "float"),
    Flag("dtype", FloatType),
    Int("rows"),
    Int("n"),
    Int("num_threads"),
)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., n] * rsqrt(mean(x^2) + eps) * weight [n] -> a new contiguous tensor; in
    bfloat16 rounded as _torch_ops.rms_norm rounds. x's rows x[i] must each be one dense
    block, x[i] and x[i + 1] may be further apart (the per-head view [T, heads, n] of a fused
    qkv's column slice)."""
    RMS_NORM.check(x, weight)
    n = x.shape[-1]
    RMS_NORM.check_shape("weight", weight, (n,))
    rows = x.numel() // n if n else 0
    group = max(math.prod(x.shape[1:-1]), 1)  # norm rows per x[i], x.stride(0) apart
    out = torch.empty(x.shape, dtype=x.dtype)
    RMS_NORM.launch(
        out=out,
        x=x,
        weight=weight,
        dtype=FLOAT_TYPE[x.dtype],
        eps=eps,
        rows=rows,
        n=n,
        group=group,
        group_stride=x.stride(0),
        num_threads=torch.get_num_threads(),
    )
    return out


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual), in one pass."""
    kernel = FUSED_ADD_RMS_NORM
    kernel.check(x, residual, weight)
    n = x.shape[-1]
    kernel.check_shape("residual", residual, x.shape)
    kernel.check_shape("weight", weight, (n,))
    rows = x.numel() // n if n else 0
    out, residual_out = torch.empty_like(x), torch.empty_like(x)
    kernel.launch(
        out=out,
        residual_out=residual_out,
        x=x,
        residual=residual,
        weight=weight,
        dtype=FLOAT_TYPE[x.dtype],
        eps=eps,
        rows=rows,
        n=n,
        num_threads=torch.get_num_threads(),
    )
    return out, residual_out


def layer_norm(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float
) -> torch.Tensor:
    """F.layer_norm(x, [n], weight, bias, eps) of x [..., n] -> a new contiguous tensor; in
    bfloat16 computed in float32 and rounded once, as torch's."""
    LAYER_NORM.check(x, weight, bias)
    n = x.shape[-1]
    LAYER_NORM.check_shape("weight", weight, (n,))
    LAYER_NORM.check_shape("bias", bias, (n,))
    out = torch.empty_like(x)
    rows = x.numel() // n if n else 0
    threads = torch.get_num_threads()
    LAYER_NORM.launch(out, x, weight, bias, FLOAT_TYPE[x.dtype], eps, rows, n, threads)
    return out


def fused_add_layer_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(layer_norm(x + residual), x + residual), in one pass over each row."""
    kernel = FUSED_ADD_LAYER_NORM
    kernel.check(x, residual, weight, bias)
    n = x.shape[-1]
    kernel.check_shape("residual", residual, x.shape)
    kernel.check_shape("weight", weight, (n,))
    kernel.check_shape("bias", bias, (n,))
    rows = x.numel() // n if n else 0
    out, residual_out = torch.empty_like(x), torch.empty_like(x)
    kernel.launch(
        out=out,
        residual_out=residual_out,
        x=x,
        residual=residual,
        weight=weight,
        bias=bias,
        dtype=FLOAT_TYPE[x.dtype],
        eps=eps,
        rows=rows,
        n=n,
        num_threads=torch.get_num_threads(),
    )
    return out, residual_out


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [..., 2d] -> silu(x[..., :d]) * x[..., d:], float32 or bfloat16."""
    out, rows, d = _gated_output(SILU_AND_MUL, x)
    SILU_AND_MUL.launch(out, x, FLOAT_TYPE[x.dtype], rows, d, torch.get_num_threads())
    return out


def gelu_and_mul(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """x [..., 2d] -> gelu(x[..., :d]) * x[..., d:], float32 or bfloat16; approximate as
    F.gelu's: "none" (the erf form) or "tanh"."""
    out, rows, d = _gated_output(GELU_AND_MUL, x)
    form = GELU_APPROXIMATE.get(approximate)
    allowed = "approximate must be one of {}, got {!r}"
    require(GELU_AND_MUL.name, form is not None, allowed, list(GELU_APPROXIMATE), approximate)
    threads = torch.get_num_threads()
    GELU_AND_MUL.launch(out, x, FLOAT_TYPE[x.dtype], form, rows, d, threads)
    return out


def gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """F.gelu(x, approximate=approximate) of x (float32 or bfloat16, contiguous) -> a new
    tensor; approximate "none" (the erf form) or "tanh"."""
    GELU.check(x)
    form = GELU_APPROXIMATE.get(approximate)
    allowed = "approximate must be one of {}, got {!r}"
    require(GELU.name, form is not None, allowed, list(GELU_APPROXIMATE), approximate)
    out = torch.empty_like(x)
    GELU.launch(out, x, FLOAT_TYPE[x.dtype], form, x.numel(), torch.get_num_threads())
    return out


def _gated_output(kernel: Kernel, x: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """x [..., 2d] checked: (its output [..., d], its row count, d)."""
    kernel.check(x)
    width = x.shape[-1]
    shape = list(x.shape)
    require(kernel.name, width % 2 == 0, "x's last dim must be even, got shape {}", shape)
    d = width // 2
    rows = x.numel() // width if width else 0
    return x.new_empty(*x.shape[:-1], d), rows, d


def lora_masked_add(
    y: torch.Tensor, delta: torch.Tensor, row_slots: torch.Tensor, slot: int
) -> torch.Tensor:
    """A new [T, n] tensor: y + delta on the rows whose row_slots entry is `slot`, y's rows
    as they are elsewhere; in bfloat16 each sum rounded once, as torch's y + delta."""
    kernel = LORA_MASKED_ADD
    kernel.check(y, delta, row_slots)
    rows, n = y.shape
    kernel.check_shape("delta", delta, y.shape)
    kernel.check_shape("row_slots", row_slots, (rows,))
    out = torch.empty_like(y)
    kernel.launch(
        out, y, delta, row_slots, slot, FLOAT_TYPE[y.dtype], rows, n, torch.get_num_threads()
    )
    return out


def scale(x: torch.Tensor, alpha: float) -> torch.Tensor:
    """A new tensor x * alpha (x float32 or bfloat16, contiguous), torch's bits."""
    SCALE.check(x)
    out = torch.empty_like(x)
    SCALE.launch(out, x, alpha, FLOAT_TYPE[x.dtype], x.numel(), torch.get_num_threads())
    return out


def add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A new tensor a + b (float32 or bfloat16, contiguous, one shape), torch's bits."""
    ADD.check(a, b)
    ADD.check_shape("b", b, a.shape)
    out = torch.empty_like(a)
    ADD.launch(out, a, b, FLOAT_TYPE[a.dtype], a.numel(), torch.get_num_threads())
    return out


def convert(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x (float32 or bfloat16, contiguous) as a new contiguous tensor of dtype (float32 or
    bfloat16), rounded as torch's .to(dtype) rounds."""
    CONVERT.check(x)
    out_type = FLOAT_TYPE.get(dtype)
    require("convert", out_type is not None, "dtype must be float32 or bfloat16, got {}", dtype)
    out = torch.empty(x.shape, dtype=dtype)
    CONVERT.launch(out, out_type, x, FLOAT_TYPE[x.dtype], x.numel())
    return out


def argmax(x: torch.Tensor) -> torch.Tensor:
    """x [rows, n] float32 or bfloat16, n >= 1 -> int64 [rows]: torch.argmax(x, dim=-1) (the
    first largest value's index, or the first NaN's)."""
    ARGMAX.check(x)
    rows, n = x.shape
    require("argmax", n > 0, "x must have at least one column, got shape {}", list(x.shape))
    out = torch.empty(rows, dtype=_I64)
    ARGMAX.launch(out, x, FLOAT_TYPE[x.dtype], rows, n, torch.get_num_threads())
    return out


def rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox_style: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """query [T, H * head_size], key [T, KV * head_size] (rows may be strided; both float32 or
    both bfloat16) rotated by cos_sin_cache [max_pos, rotary_dim] (float32) at positions [T]
    -> new contiguous tensors of their dtype."""
    kernel = ROTARY_EMBEDDING
    op = kernel.name
    kernel.check(positions, query, key, cos_sin_cache)
    (t,), (q_rows, q_width), (k_rows, k_width) = positions.shape, query.shape, key.shape
    num_positions, rotary_dim = cos_sin_cache.shape
    tokens = "query, key and positions have {}, {} and {} tokens"
    require(op, q_rows == k_rows == t, tokens, q_rows, k_rows, t)
    require(
        op,
        type(head_size) is int and 0 < rotary_dim <= head_size and rotary_dim % 2 == 0,
        "rotary_dim {} must be even and in [2, head_size={!r}]",
        rotary_dim,
        head_size,
    )
    require(
        op,
        q_width % head_size == 0 and k_width % head_size == 0,
        "query width {} and key width {} must be multiples of head_size {}",
        q_width,
        k_width,
        head_size,
    )
    query_out, key_out = query.new_empty(t, q_width), key.new_empty(t, k_width)
    kernel.launch(
        positions=positions,
        query=query,
        key=key,
        query_out=query_out,
        key_out=key_out,
        dtype=FLOAT_TYPE[query.dtype],
        q_stride=query.stride(0),
        k_stride=key.stride(0),
        num_tokens=t,
        num_heads=q_width // head_size,
        num_kv_heads=k_width // head_size,
        head_size=head_size,
        rot_dim=rotary_dim,
        cos_sin_cache=cos_sin_cache,
        style=RotaryStyle.NEOX if is_neox_style else RotaryStyle.GPTJ,
        num_threads=torch.get_num_threads(),
        num_positions=num_positions,
    )
    return query_out, key_out
