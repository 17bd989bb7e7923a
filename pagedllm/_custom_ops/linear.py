"""Unquantized linear layers: the weight's layout and kernel chosen once at load
(prepack_linear_weight, select_linear_kernel), then `linear` runs that kernel for every
row count."""

import enum
from collections.abc import Callable

import torch

from pagedllm import _cpu_kernels, _torch_ops
from pagedllm._custom_ops.common import (
    _FLOAT32_OR_BF16,
    _one_float_dtype,
    cpu_kernels_apply,
    has_cpu_kernels,
)


def prepack_linear_weight(weight: torch.Tensor) -> torch.Tensor:
    """A CPU weight [N, K] in the layout its kernel streams fastest, packed once at load:
    bfloat16 in AMX tiles (`_cpu_kernels.amx_pack_bf16`, [N / 16, K / 32, 16, 32]) where the
    CPU has them and N % 16 == 0, K % 32 == 0; else, where the best skinny_gemm build reads
    a packed order for the weight's dtype (`_cpu_kernels.skinny_gemm_reads_packed`: bfloat16
    in the avx512_bf16 build, float32 in the avx2 one) and the weight is whole blocks of it,
    that order (`_cpu_kernels.skinny_pack`); else `weight` itself. linear() takes any of
    them, skinny_pack's with the plain weight's bits.

    The rule: a packed order lays each tile's weight rows out as one stream, where a plain
    weight's are several streams K values apart that the CPU's prefetchers follow worse
    (the avx512_bf16 build runs 1.25-1.5x faster at 1 row on it), and spares the avx2 build
    transposing its panels of 16 weight rows on every call (1.6x at 1 row). AMX tiles match
    skinny_gemm_bf16 at 1-4 rows, where both read at the memory's bandwidth, and outrun it
    and oneDNN's F.linear from 16 rows. BENCHMARKS.md has the figures; `pagedllm bench
    linear --dtype bfloat16` (or `--isa avx2`) re-measures skinny_gemm against F.linear."""
    if not weight.is_cpu or weight.dim() != 2 or weight.requires_grad:
        return weight
    pack = _packing(weight)
    return weight if pack is None else pack(weight.detach().contiguous())


def packs_linear_weight(shape: tuple[int, ...], dtype: torch.dtype) -> bool:
    """Whether prepack_linear_weight lays a CPU weight of this shape and dtype out anew on
    this machine: a tied LM head then holds that copy beside the embedding's rows
    (`pagedllm inspect` counts it)."""
    return len(shape) == 2 and _packing(torch.empty(shape, dtype=dtype, device="meta")) is not None


def _packing(weight: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The pack function prepack_linear_weight applies to weight [N, K] here, or None."""
    if not has_cpu_kernels():
        return None
    n, k = weight.shape
    bf16 = weight.dtype is torch.bfloat16
    if bf16 and _cpu_kernels.amx_available() and n % 16 == 0 and k % 32 == 0:
        return _cpu_kernels.amx_pack_bf16
    if _cpu_kernels.skinny_packable(weight) and _cpu_kernels.skinny_gemm_reads_packed(weight.dtype):
        return _cpu_kernels.skinny_pack
    return None


class LinearKernel(enum.Enum):
    """What multiplies an unquantized weight, chosen once at load (select_linear_kernel) and
    kept on the layer (`layer.linear_kernel`), so what runs is decided there, not per call."""

    AMX = "amx_gemm_bf16"
    """bf16 weights in AMX tiles (prepack_linear_weight on a CPU with AMX)."""
    SKINNY = "skinny_gemm"
    """float32 or bf16 CPU weights, plain or in skinny_pack's order: the best build."""
    TORCH = "torch"
    """_torch_ops.linear: GPUs, float16, no extension (row by row in batch-invariant mode)."""


def _is_amx_tiles(weight: torch.Tensor) -> bool:
    """amx_pack_bf16's layout [N / 16, K / 32, 16, 32] (skinny_pack's is [.., 4, 32] or 3-D)."""
    return weight.dim() == 4 and weight.shape[2] == 16


def select_linear_kernel(weight: torch.Tensor) -> LinearKernel:
    """The kernel for a weight as prepack_linear_weight left it, multiplied by activations
    of its own dtype."""
    if _is_amx_tiles(weight):
        return LinearKernel.AMX
    if cpu_kernels_apply(weight, dtypes=_FLOAT32_OR_BF16):
        return LinearKernel.SKINNY
    return LinearKernel.TORCH


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    packed_weight: torch.Tensor | None = None,
    kernel: LinearKernel | None = None,
) -> torch.Tensor:
    """F.linear(x, weight, bias): [..., K] x [N, K] -> [..., N], float32 or bfloat16; weight
    may be prepack_linear_weight's. packed_weight, where given (a tied LM head's copy), is
    prepack_linear_weight(weight), multiplied instead of weight. kernel: the layer's
    select_linear_kernel, run as chosen (its wrapper raises ValueError on tensors it cannot
    take); None (a weight outside a layer, such as an expert's slice) chooses here, and takes
    torch's path for activations the kernel cannot take.

    Every row count runs one kernel on a weight, skinny_gemm's best build or AMX tiles, and
    each sums every output in one order whatever M is: a row's result does not depend on the
    rows beside it, their number or their values (the batch, how a prompt is chunked, how
    much of it the prefix cache held). Where no kernel applies (GPUs, float16, autograd, no
    extension), F.linear, whose bits may change with M."""
    if packed_weight is not None:
        weight = packed_weight
    if kernel is None and _is_amx_tiles(weight):
        kernel = LinearKernel.AMX
    elif kernel is None:
        fits = cpu_kernels_apply(x, weight, bias, dtypes=_one_float_dtype(x))
        kernel = LinearKernel.SKINNY if fits else LinearKernel.TORCH
    if kernel is LinearKernel.AMX:
        return _amx_linear(x, weight, bias)
    if kernel is LinearKernel.SKINNY:
        return _skinny_linear(x, weight, bias)
    return _torch_ops.linear(x, weight, bias)


def _skinny_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    gemm = _cpu_kernels.skinny_gemm_bf16 if x.dtype is torch.bfloat16 else _cpu_kernels.skinny_gemm
    k = x.shape[-1]
    x2 = (x if x.dim() == 2 else x.reshape(-1, k)).contiguous()
    bias = None if bias is None else bias.contiguous()
    y = gemm(x2, weight.contiguous(), bias)
    return y if x.dim() == 2 else y.view(*x.shape[:-1], y.shape[1])


def _amx_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    k = x.shape[-1]
    x2 = x.reshape(-1, k).to(torch.bfloat16).contiguous()
    bias = None if bias is None else bias.to(torch.bfloat16).contiguous()
    y = _cpu_kernels.amx_gemm_bf16(x2, packed, bias)
    return y.view(*x.shape[:-1], y.shape[-1])
