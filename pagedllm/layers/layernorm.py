"""RMSNorm with an optional fused residual add, computed in float32 like transformers.

On CPU in float32 both run as one pagedllm._C kernel; the torch code is the fallback.
"""

import torch

from pagedllm import _custom_ops
from pagedllm.layers.inference_module import InferenceModule
from pagedllm.layers.parameter import default_weight_loader, new_parameter


class RMSNorm(InferenceModule):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = new_parameter((hidden_size,), default_weight_loader)
        with torch.no_grad():
            if not self.weight.is_meta:
                self.weight.fill_(1.0)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """`forward(x)` returns norm(x); `forward(x, residual)` returns
        (norm(x + residual), x + residual), the new residual stream."""
        if _custom_ops.cpu_kernels_apply(x, residual, self.weight):
            if residual is None:
                return _custom_ops.rms_norm(x, self.weight, self.eps)
            return _custom_ops.fused_add_rms_norm(x, residual, self.weight, self.eps)
        if residual is None:
            return self._norm(x)
        residual = x + residual
        return self._norm(residual), residual

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"
