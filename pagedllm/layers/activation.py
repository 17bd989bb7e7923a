"""Gated activations."""

import torch
import torch.nn.functional as F
from torch import nn

from pagedllm import _custom_ops


class SiluAndMul(nn.Module):
    """[..., 2d] -> silu(x[..., :d]) * x[..., d:], the SwiGLU of Llama-style MLPs."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _custom_ops.cpu_kernels_apply(x):
            return _custom_ops.silu_and_mul(x)
        d = x.shape[-1] // 2
        return F.silu(x[..., :d]) * x[..., d:]
