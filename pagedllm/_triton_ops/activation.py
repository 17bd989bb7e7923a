"""Activation-and-mul in Triton: [M, 2 I] gate|up -> [M, I] act(gate) * up, float32 inside,
one launch where torch takes two. SiLU (the fused MoE's activation, and a dense MLP's on a
GPU) and GELU in both of F.gelu's forms (Gemma's MLPs)."""

import torch
import triton
import triton.language as tl

from pagedllm._triton_ops.launch import for_device

# The activations, by ACTIVATION (constexprs, the globals a kernel may read).
SILU = tl.constexpr(0)
GELU = tl.constexpr(1)  # the erf form
GELU_TANH = tl.constexpr(2)
GELU_FORMS = {"none": GELU, "tanh": GELU_TANH}  # by F.gelu's `approximate`


@triton.jit
def _activate(gate, ACTIVATION: tl.constexpr):
    if ACTIVATION == GELU:
        result = 0.5 * gate * (1.0 + tl.erf(gate * 0.7071067811865476))
    elif ACTIVATION == GELU_TANH:
        # 0.5 x (1 + tanh(y)) = x sigmoid(2y): tl has no tanh on every Triton.
        inner = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)
        result = gate * tl.sigmoid(2.0 * inner)
    else:
        result = gate * tl.sigmoid(gate)
    return result


@triton.jit
def act_and_mul_kernel(
    x_ptr, out_ptr, d, stride_x, stride_out, ACTIVATION: tl.constexpr, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)  # row * stride_x passes 2**31 in a step of 75k tokens
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + d + cols, mask=mask, other=0.0).to(tl.float32)
    # act(gate) rounded to the output's dtype before the product, as the torch definition
    # and transformers' MLPs compute it in bfloat16 or float16.
    act = _activate(gate, ACTIVATION).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, (act * up).to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, 2 I] (rows contiguous) -> [M, I] silu(x[:, :I]) * x[:, I:], into `out` if given."""
    return _act_and_mul(x, SILU, out)


def gelu_and_mul(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """x [M, 2 I] (rows contiguous) -> [M, I] gelu(x[:, :I]) * x[:, I:]; approximate as
    F.gelu's: "none" (the erf form) or "tanh"."""
    if approximate not in GELU_FORMS:
        raise ValueError(f"approximate must be one of {list(GELU_FORMS)}, got {approximate!r}")
    return _act_and_mul(x, GELU_FORMS[approximate])


def _act_and_mul(
    x: torch.Tensor, activation: tl.constexpr, out: torch.Tensor | None = None
) -> torch.Tensor:
    rows, d = x.shape[0], x.shape[1] // 2
    if out is None:
        out = x.new_empty(rows, d)
    block = min(1024, triton.next_power_of_2(d))
    grid = (rows, triton.cdiv(d, block))
    if rows:
        for_device(act_and_mul_kernel, x.device)[grid](
            x, out, d, x.stride(0), out.stride(0), ACTIVATION=activation.value, BLOCK=block
        )
    return out
