"""RMSNorm, with the residual add fused, in Triton: one program a row, one launch a layer.

On a GPU the torch definition (pagedllm/_torch_ops.py) is 8 kernels (9 with the add), each
a launch and a pass over the row; in a decode step's CUDA graph those small kernels, not
the bytes, set the time. The arithmetic is the torch definition's, as transformers'
LlamaRMSNorm: the sum of squares in float32, the normed row rounded to the input's dtype
before the weight's product, and the residual rounded to its dtype before it is normed.
Each row is summed alone, so its bits do not depend on the rows beside it.
"""

import torch
import triton
import triton.language as tl

from pagedllm._triton_ops.launch import for_device

MAX_HIDDEN = 65536  # one row's block lives in registers; wider rows keep the torch path


@triton.jit
def rms_norm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    residual_out_ptr,
    n,
    stride_x,
    stride_residual,
    stride_out,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        residual = tl.load(residual_ptr + row * stride_residual + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + residual.to(tl.float32)).to(residual_out_ptr.dtype.element_ty)
        tl.store(residual_out_ptr + row * n + cols, x, mask=mask)
    x = x.to(tl.float32)
    mean_square = tl.sum(x * x, axis=0) / n
    normed = (x * tl.math.rsqrt(mean_square + eps)).to(out_ptr.dtype.element_ty)
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0)
    out = normed.to(tl.float32) * weight.to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def applies(x: torch.Tensor) -> bool:
    """Whether the kernel takes rows as wide as x's."""
    return x.shape[-1] <= MAX_HIDDEN


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., n] * rsqrt(mean(x^2) + eps) * weight [n], in x's dtype."""
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _launch(x, None, weight, out, None, eps)
    return out


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual), both in x's dtype (x and residual share it)."""
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    residual_out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _launch(x, residual, weight, out, residual_out, eps)
    return out, residual_out


def _launch(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    out: torch.Tensor,
    residual_out: torch.Tensor | None,
    eps: float,
) -> None:
    n = x.shape[-1]
    x2 = _rows(x)
    rows = x2.shape[0]
    if rows == 0:
        return
    residual2 = _rows(residual) if residual is not None else x2
    block = triton.next_power_of_2(n)
    for_device(rms_norm_kernel, x.device)[(rows,)](
        x2,
        residual2,
        weight.contiguous(),
        out,
        residual_out if residual_out is not None else out,
        n,
        x2.stride(0),
        residual2.stride(0),
        n,
        eps,
        HAS_RESIDUAL=residual is not None,
        BLOCK=block,
        num_warps=_num_warps(block),
    )


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as [rows, n] with unit stride along n (a view where it can be)."""
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def _num_warps(block: int) -> int:
    """A warp per 256 lanes, 1 to 16: each thread holds 8 or fewer of the row's values."""
    return max(1, min(16, block // 256))
