"""When a kernel applies (the extension built; CPU tensors of its dtypes; no autograd; or
Triton's row-wise kernels on CUDA tensors) and the layouts the kernels take."""

import functools
import os

import torch

from pagedllm import _cpu_kernels, _triton_ops


def has_cpu_kernels() -> bool:
    return _cpu_kernels.available()


_FLOAT32 = (torch.float32,)


_FLOAT32_OR_BF16 = (torch.float32, torch.bfloat16)


def cpu_kernels_apply(
    *tensors: torch.Tensor | None, dtypes: tuple[torch.dtype, ...] = _FLOAT32
) -> bool:
    """True when pagedllm._C can take these tensors: CPU, of one of `dtypes`, no autograd.

    Called for every layer of every step, so it is a plain loop."""
    if not _cpu_kernels.available():
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if t is not None and (not t.is_cpu or t.dtype not in dtypes or (grad and t.requires_grad)):
            return False
    return True


_TRITON_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
ROWWISE_KERNELS_ENV = "PAGEDLLM_ROWWISE_KERNELS"


@functools.cache
def rowwise_triton() -> bool:
    """Whether CUDA tensors' row-wise ops take the Triton kernels: triton is installed and
    PAGEDLLM_ROWWISE_KERNELS is "triton" (the default), not "torch" (torch's definitions,
    for comparing the two: the GPU check does)."""
    choice = os.environ.get(ROWWISE_KERNELS_ENV, "triton").strip().lower()
    if choice not in ("triton", "torch"):
        raise ValueError(f'{ROWWISE_KERNELS_ENV} must be "triton" or "torch", got {choice!r}')
    return choice == "triton" and _triton_ops.has_triton()


def triton_kernels_apply(*tensors: torch.Tensor) -> bool:
    """True when pagedllm._triton_ops' row-wise kernels take these tensors: CUDA, one float
    dtype (float32, bfloat16 or float16) shared by all, no autograd, `rowwise_triton()`. On
    a GPU torch's definitions of these ops are a launch per elementwise step; in a decode
    step those small kernels, not the bytes, set the time (docs/gpus.md)."""
    first = tensors[0]
    if not first.is_cuda or first.dtype not in _TRITON_DTYPES or not rowwise_triton():
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if not t.is_cuda or t.dtype is not first.dtype or (grad and t.requires_grad):
            return False
    return True


def _one_float_dtype(x: torch.Tensor) -> tuple[torch.dtype, ...]:
    """The `dtypes` of cpu_kernels_apply for an op whose tensors all share x's dtype, float32
    or bfloat16 (its kernel takes either, not a mix)."""
    return (x.dtype,) if x.dtype in _FLOAT32_OR_BF16 else ()


def _as_dense(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x as a contiguous tensor of dtype; the runner's index tensors already are, and are
    passed as they are (a no-op .to().contiguous() still costs microseconds per layer)."""
    return x if x.dtype is dtype and x.is_contiguous() else x.to(dtype).contiguous()


def _as_float32(x: torch.Tensor) -> torch.Tensor:
    """A contiguous float32 or bfloat16 x in float32, converted by the kernel (a launch that
    record_launches sees, unlike torch's .to)."""
    return x if x.dtype is torch.float32 else _cpu_kernels.convert(x, torch.float32)
