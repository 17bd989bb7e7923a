"""Where a Triton kernel can run: compiled on GPUs; on CPU tensors only under Triton's
interpreter (numpy, one program at a time; for tests, not for speed).

`triton.jit` decides between the two forms when it decorates, from TRITON_INTERPRET, so
the variable must be set before this package's kernel modules are imported, and then
holds for the whole process.
"""

import torch
from triton.runtime.jit import JITFunction, KernelInterface


def for_device(kernel: KernelInterface, device: torch.device) -> KernelInterface:
    """`kernel`, checked to be launchable on tensors of `device`: kernel[grid](...)."""
    if device.type == "cpu" and isinstance(kernel, JITFunction):
        raise ValueError(
            f"the Triton kernel {kernel.fn.__name__} got CPU tensors: Triton runs on CPU "
            "tensors only under its interpreter, with TRITON_INTERPRET=1 set before "
            "pagedllm._triton_ops is imported"
        )
    return kernel
