"""Gated activations."""

import torch
import torch.nn.functional as F

from pagedllm import _custom_ops
from pagedllm.layers.inference_module import InferenceModule


class SiluAndMul(InferenceModule):
    """[..., 2d] -> silu(x[..., :d]) * x[..., d:], the SwiGLU of Llama-style MLPs."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _custom_ops.cpu_kernels_apply(x):
            return _custom_ops.silu_and_mul(x)
        d = x.shape[-1] // 2
        return F.silu(x[..., :d]) * x[..., d:]
