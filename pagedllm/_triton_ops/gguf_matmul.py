"""x @ W^T for W in GGUF's 32-weight blocks (Q4_0, Q4_1, Q8_0), in Triton: each tile of W is
dequantized in registers from the blocks as stored and multiplied with tl.dot, float32
accumulation, so the weights cross the memory bus at their 4.5-8.5 bits per weight.

These are the types quantized Hugging Face checkpoints (GPTQ, AWQ, compressed-tensors) run
in, and the legacy GGUF types; on a GPU the torch reference (pagedllm/_torch_quant.py) would
dequantize the whole matrix on every call. The arithmetic is the reference's: each weight
dequantized in float32 (d * (q - 8), d * q + m, d * q, d and m fp16), rounded to x's dtype,
products summed in float32 (float32 x: in IEEE float32, no TF32).
"""

import torch
import triton
import triton.language as tl
from gguf import GGMLQuantizationType

from pagedllm._triton_ops import interpreting
from pagedllm._triton_ops.launch import for_device

Q = GGMLQuantizationType
TYPES = {Q.Q4_0: 18, Q.Q4_1: 20, Q.Q8_0: 34}
"""The types the kernel reads, with their bytes per block of 32 weights."""


@triton.jit
def _f16(ptr, offsets, mask):
    """The little-endian fp16 at byte offsets (unaligned), as float32."""
    lo = tl.load(ptr + offsets, mask=mask, other=0).to(tl.uint16)
    hi = tl.load(ptr + offsets + 1, mask=mask, other=0).to(tl.uint16)
    return (lo | (hi << 8)).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def gguf_matmul_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_om,
    QTYPE: tl.constexpr,
    TYPE_SIZE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    WIDEN: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok, col_ok = rows < M, cols < N
    w_rows = w_ptr + cols.to(tl.int64)[:, None] * stride_wn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < K
        x = tl.load(
            x_ptr + rows.to(tl.int64)[:, None] * stride_xm + k[None, :],
            mask=row_ok[:, None] & k_ok[None, :],
            other=0.0,
        )
        mask = col_ok[:, None] & k_ok[None, :]
        block = (k // 32)[None, :] * TYPE_SIZE
        within = (k % 32)[None, :]
        d = _f16(w_rows, block, mask)
        if QTYPE == 8:  # Q8_0: d, then 32 int8
            q = tl.load(w_rows + block + 2 + within, mask=mask, other=0)
            w = d * q.to(tl.int8, bitcast=True).to(tl.float32)
        else:  # Q4_0 / Q4_1: byte j holds weights j (low nibble) and j + 16 (high)
            head = 2 if QTYPE == 2 else 4
            byte = tl.load(w_rows + block + head + within % 16, mask=mask, other=0)
            q = ((byte.to(tl.int32) >> ((within // 16) * 4)) & 15).to(tl.float32)
            if QTYPE == 2:  # Q4_0
                w = d * (q - 8.0)
            else:  # Q4_1
                w = d * q + _f16(w_rows, block + 2, mask)
        w = w.to(x.dtype)
        if WIDEN or x.dtype == tl.float32:  # bf16/fp16 widened exactly: the same products
            acc += tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), input_precision="ieee")
        else:
            acc += tl.dot(x, tl.trans(w))
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    out = out_ptr + rows.to(tl.int64)[:, None] * stride_om + cols[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def applies(qtype: int) -> bool:
    return int(qtype) in {int(t) for t in TYPES}


def gguf_matmul(
    x: torch.Tensor, qweight: torch.Tensor, qtype: int, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x [..., K] (float32, bfloat16 or float16) @ W^T (+ bias [N]) -> [..., N] in x's dtype,
    for W [N, K] the blocks qweight [N, K / 32 * type_size] of qtype (one of TYPES)."""
    qtype = Q(int(qtype))
    k = x.shape[-1]
    n, row_bytes = qweight.shape
    if row_bytes != k // 32 * TYPES[qtype] or k % 32:
        raise ValueError(f"{qtype.name} rows of {row_bytes} bytes do not hold {k} weights")
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m:
        block_m = 16 if m <= 16 else 64
        grid = (triton.cdiv(m, block_m), triton.cdiv(n, 64))
        for_device(gguf_matmul_kernel, x.device)[grid](
            x2,
            qweight,
            bias if bias is not None else x2,
            out,
            m,
            n,
            k,
            x2.stride(0),
            qweight.stride(0),
            out.stride(0),
            QTYPE=int(qtype),
            TYPE_SIZE=TYPES[qtype],
            HAS_BIAS=bias is not None,
            BLOCK_M=block_m,
            BLOCK_N=64,
            BLOCK_K=64,
            # the interpreter's tl.dot multiplies numpy arrays, which hold bf16 as raw bits
            WIDEN=interpreting(),
        )
    return out.view(*x.shape[:-1], n)
