"""RMSNorm and LayerNorm with an optional fused residual add, computed in float32 like
transformers.

The arithmetic is `_custom_ops.rms_norm` / `fused_add_rms_norm` (`layer_norm` /
`fused_add_layer_norm`): one pagedllm._C kernel on CPU in float32 or bfloat16, torch
elsewhere.
"""

import torch

from pagedllm import _custom_ops
from pagedllm.layers.inference_module import InferenceModule
from pagedllm.layers.parameter import copy_weight, default_weight_loader, new_parameter


class RMSNorm(InferenceModule):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = new_parameter((hidden_size,), default_weight_loader)
        with torch.no_grad():
            if not self.weight.is_meta:
                self.weight.fill_(1.0)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """`forward(x)` returns norm(x); `forward(x, residual)` returns
        (norm(x + residual), x + residual), the new residual stream."""
        if residual is None:
            return _custom_ops.rms_norm(x, self.weight, self.eps)
        return _custom_ops.fused_add_rms_norm(x, residual, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


class GemmaRMSNorm(RMSNorm):
    """Gemma's RMSNorm, which scales by 1 + weight: a checkpoint's weight w is kept as 1 + w,
    so the arithmetic is RMSNorm's. The sum is exact in float64 and rounded once to the
    parameter's dtype: in float32 that is transformers' float32 1 + w, and a GGUF's norm,
    stored as 1 + w and handed over as w in float64 (pagedllm/gguf/gemma.py), comes back
    bit for bit."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__(hidden_size, eps)
        self.weight.weight_loader = load_offset_weight


def load_offset_weight(
    param: torch.Tensor, loaded_weight: torch.Tensor, shard_id: object = None
) -> None:
    copy_weight(param, loaded_weight.double() + 1.0)


class LayerNorm(InferenceModule):
    """torch's nn.LayerNorm over the last dim, with its weight and bias (StarCoder 2's norms),
    called as RMSNorm is, so a decoder layer takes either."""

    def __init__(self, hidden_size: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = new_parameter((hidden_size,), default_weight_loader)
        self.bias = new_parameter((hidden_size,), default_weight_loader)
        with torch.no_grad():
            if not self.weight.is_meta:
                self.weight.fill_(1.0)
                self.bias.zero_()

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """`forward(x)` returns norm(x); `forward(x, residual)` returns
        (norm(x + residual), x + residual), the new residual stream."""
        if residual is None:
            return _custom_ops.layer_norm(x, self.weight, self.bias, self.eps)
        return _custom_ops.fused_add_layer_norm(x, residual, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"
