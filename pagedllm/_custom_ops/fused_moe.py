"""Which kernel runs a FusedMoE layer's unquantized experts, chosen once at load.

GPUs run every expert in two grouped GEMM launches (_triton_ops/fused_moe.py, vLLM's
fused_experts), with no per-expert Python loop and no host sync. CPUs keep the layer's
grouped loop, one matmul per active expert on the tuned linear kernels (the Triton path
runs there only under Triton's interpreter, which tests select by hand).
"""

import enum
from typing import Any

import torch

from pagedllm import _torch_ops, _triton_ops
from pagedllm._custom_ops.common import triton_kernels_apply
from pagedllm.batch_invariant import is_batch_invariant


class MoEKernel(enum.Enum):
    """What runs a FusedMoE layer's float experts, kept on the layer as `moe_kernel`."""

    GROUPED = "grouped"
    """FusedMoE.apply_experts: each active expert's apply_expert over its tokens."""
    TRITON = "triton"
    """_triton_ops.fused_moe.fused_experts: the weights stay plain [E, N, K]."""


def select_moe_kernel(w13: torch.Tensor) -> MoEKernel:
    """TRITON for CUDA weights where triton is installed, outside batch-invariant mode (its
    block sizes, and so each row's sums, depend on the batch's token count); GROUPED
    elsewhere."""
    if w13.is_cuda and _triton_ops.has_triton() and not is_batch_invariant():
        return MoEKernel.TRITON
    return MoEKernel.GROUPED


def topk_softmax(
    router_logits: torch.Tensor, top_k: int, renormalize: bool, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """A MoE layer's routing (_torch_ops.topk_softmax): one Triton launch for CUDA logits
    (_triton_ops/topk_softmax.py, one program a token, so batch-invariant too), torch's
    five kernels elsewhere."""
    if triton_kernels_apply(router_logits) and router_logits.dim() == 2:
        from pagedllm._triton_ops import topk_softmax as triton_routing

        if triton_routing.applies(top_k, router_logits.shape[1]):
            return triton_routing.topk_softmax(router_logits, top_k, renormalize, dtype)
    return _torch_ops.topk_softmax(router_logits, top_k, renormalize, dtype)


def fused_experts(*tensors: torch.Tensor, **options: Any) -> torch.Tensor:
    """_triton_ops.fused_moe.fused_experts (hidden_states, w13, w2, topk_weights, topk_ids;
    its options and shapes there), imported at the first call so that pagedllm imports
    without triton."""
    from pagedllm._triton_ops.fused_moe import fused_experts as triton_fused_experts

    return triton_fused_experts(*tensors, **options)
