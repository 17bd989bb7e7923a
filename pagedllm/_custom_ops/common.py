"""When a kernel applies (the extension built; CPU tensors of its dtypes; no autograd) and
the layouts the kernels take."""

import torch

from pagedllm import _cpu_kernels


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
