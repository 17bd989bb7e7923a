"""GGUF and int8 weights: packed once at load for gguf_mm, multiplied and looked up; their
torch definitions where the kernels do not apply."""

import torch
from gguf import GGMLQuantizationType as Q

from pagedllm import _cpu_kernels, _torch_ops, _torch_quant
from pagedllm._custom_ops.common import (
    _as_dense,
    _one_float_dtype,
    cpu_kernels_apply,
    triton_kernels_apply,
)
from pagedllm.batch_invariant import is_batch_invariant

_GGUF_KERNEL_TYPES = frozenset(int(t) for t in _cpu_kernels.GGUF_TYPES)
_TRITON_TYPES = frozenset(int(t) for t in (Q.Q4_0, Q.Q4_1, Q.Q8_0))
"""The types _triton_ops/gguf_matmul.py reads (kept here: that module imports triton)."""


def _gguf_kernels_apply(qweight: torch.Tensor, qtype: int) -> bool:
    """pagedllm._C can read qweight: a CPU uint8 tensor [..., bytes] of a type it knows."""
    return (
        _cpu_kernels.available()
        and qweight.is_cpu
        and qweight.dtype == torch.uint8
        and qweight.dim() > 0
        and int(qtype) in _GGUF_KERNEL_TYPES
    )


def gguf_pack(qweight: torch.Tensor, qtype: int) -> torch.Tensor | None:
    """The GGUF blocks qweight [..., N, K / block_size * type_size] of qtype in the layout
    gguf_packed_linear multiplies ([..., groups of 16 rows, bytes]: csrc/gguf_packed.h), where
    pagedllm._C runs them (a CPU weight); None elsewhere, where the blocks stay and
    gguf_linear multiplies them in torch. Called once per weight at load."""
    if qweight.dim() < 2 or not _gguf_kernels_apply(qweight, qtype):
        return None
    if qweight.dim() == 2:
        return _cpu_kernels.gguf_pack(qweight.detach().contiguous(), int(qtype))
    matrices = qweight.detach().reshape(-1, *qweight.shape[-2:]).contiguous()
    n, k = _cpu_kernels.gguf_weight_shape(matrices[0], int(qtype))
    packed = torch.empty(
        len(matrices), *_cpu_kernels.gguf_packed_shape(qtype, n, k), dtype=torch.uint8
    )
    for w, out in zip(matrices, packed, strict=True):
        _cpu_kernels.gguf_pack(w, int(qtype), out=out)
    return packed.view(*qweight.shape[:-2], *packed.shape[1:])


def gguf_packed_linear(
    x: torch.Tensor,
    packed: torch.Tensor,
    qtype: int,
    n: int,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [..., K] @ W^T (+ bias [N]) -> [..., N] for W [N, K] the GGUF weight gguf_pack made
    `packed` of: pagedllm._C's gguf_mm for CPU float32 or bfloat16 x (each row quantized to
    8-bit blocks, its result the same bits whatever the other rows: csrc/gguf_packed.h);
    otherwise W unpacked to float32 and F.linear."""
    k = x.shape[-1]
    dtypes = _one_float_dtype(x)
    if not cpu_kernels_apply(x, bias, dtypes=dtypes) or (
        bias is not None and bias.dtype != x.dtype
    ):
        rows = torch.arange(n, dtype=torch.int64)
        w = _cpu_kernels.gguf_unpack_rows(packed, int(qtype), n, k, rows)
        return _torch_ops.linear(x, w.to(x.dtype), bias)
    x2 = (x if x.dim() == 2 else x.reshape(-1, k)).contiguous()
    bias = None if bias is None else bias.contiguous()
    y = _cpu_kernels.gguf_mm(x2, packed, int(qtype), n, bias)
    return y if x.dim() == 2 else y.view(*x.shape[:-1], n)


def gguf_packed_embedding(
    input_ids: torch.Tensor, packed: torch.Tensor, qtype: int, n: int, k: int
) -> torch.Tensor:
    """Rows input_ids [...] of the GGUF table [n, k] gguf_pack made `packed` of -> float32
    [..., k], bit-equal to gguf.quants.dequantize of their blocks."""
    ids = _as_dense(input_ids.reshape(-1), torch.int64)
    w = _cpu_kernels.gguf_unpack_rows(packed, int(qtype), n, k, ids)
    return w.view(*input_ids.shape, k)


def gguf_linear(
    x: torch.Tensor, qweight: torch.Tensor, qtype: int, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x [..., K] @ W^T (+ bias [N]) -> [..., N], W [N, K] being the GGUF blocks qweight
    [N, K / block_size * type_size] of qtype as stored (weights gguf_pack leaves as they are:
    GPUs, no extension). On a GPU, Q4_0 / Q4_1 / Q8_0 (the types quantized HF checkpoints
    run in) go through the Triton kernel that dequantizes tiles as it multiplies
    (_triton_ops/gguf_matmul.py); otherwise the weight is dequantized and multiplied in torch
    (_torch_ops.linear, so row by row in batch-invariant mode)."""
    if _gguf_triton_applies(x, qweight, qtype, bias):
        from pagedllm._triton_ops.gguf_matmul import gguf_matmul

        return gguf_matmul(x, qweight, qtype, bias)
    return _torch_ops.linear(x, _torch_quant.dequantize(qweight, qtype).to(x.dtype), bias)


def _gguf_triton_applies(
    x: torch.Tensor, qweight: torch.Tensor, qtype: int, bias: torch.Tensor | None
) -> bool:
    """CUDA tensors of one float dtype, a 2-D weight of a type the kernel reads, outside
    batch-invariant mode (its tiles' sums are not the row-by-row path's)."""
    tensors = (x,) if bias is None else (x, bias)
    return (
        int(qtype) in _TRITON_TYPES
        and qweight.is_cuda
        and qweight.dim() == 2
        and triton_kernels_apply(*tensors)
        and not is_batch_invariant()
    )


def gguf_dequantize(qweight: torch.Tensor, qtype: int) -> torch.Tensor:
    """qweight uint8 [..., K / block_size * type_size] of qtype -> float32 [..., K],
    bit-equal to gguf.quants.dequantize."""
    if not _gguf_kernels_apply(qweight, qtype):
        return _torch_quant.dequantize(qweight, qtype)
    rows = qweight.reshape(-1, qweight.shape[-1]).contiguous()
    w = _cpu_kernels.gguf_dequantize(rows, qtype)
    return w.view(*qweight.shape[:-1], w.shape[1])


def gguf_embedding(input_ids: torch.Tensor, qweight: torch.Tensor, qtype: int) -> torch.Tensor:
    """Rows input_ids [...] of the GGUF table qweight [V, bytes] -> float32 [..., K]; only
    the looked-up rows are dequantized."""
    w = gguf_dequantize(qweight.index_select(0, input_ids.reshape(-1)), qtype)
    return w.view(*input_ids.shape, w.shape[-1])
