"""Gated activations."""

import torch

from pagedllm import _custom_ops
from pagedllm.layers.inference_module import InferenceModule


class SiluAndMul(InferenceModule):
    """[..., 2d] -> silu(x[..., :d]) * x[..., d:], the SwiGLU of Llama-style MLPs."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _custom_ops.silu_and_mul(x)
