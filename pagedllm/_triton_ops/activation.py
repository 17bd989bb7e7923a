"""SiLU-and-mul in Triton: [M, 2 I] gate|up -> [M, I] silu(gate) * up, float32 inside: the
fused MoE's activation, and a dense MLP's on a GPU (one launch where torch takes two)."""

import torch
import triton
import triton.language as tl

from pagedllm._triton_ops.launch import for_device


@triton.jit
def silu_and_mul_kernel(x_ptr, out_ptr, d, stride_x, stride_out, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # row * stride_x passes 2**31 in a step of 75k tokens
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + d + cols, mask=mask, other=0.0).to(tl.float32)
    # silu(gate) rounded to the output's dtype before the product, as the torch definition
    # and transformers' MLPs compute it in bfloat16 or float16.
    silu = (gate * tl.sigmoid(gate)).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, (silu * up).to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, 2 I] (rows contiguous) -> [M, I], into `out` if given."""
    rows, d = x.shape[0], x.shape[1] // 2
    if out is None:
        out = x.new_empty(rows, d)
    block = min(1024, triton.next_power_of_2(d))
    grid = (rows, triton.cdiv(d, block))
    if rows:
        for_device(silu_and_mul_kernel, x.device)[grid](
            x, out, d, x.stride(0), out.stride(0), BLOCK=block
        )
    return out
