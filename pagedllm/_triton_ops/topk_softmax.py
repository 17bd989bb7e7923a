"""A MoE layer's routing in Triton, as vLLM's topk_softmax: softmax over the experts, the
top k, renormalised if asked, in one launch (torch's definition is 5 kernels a layer:
softmax, topk, sum, divide, cast). One program a token; float32 inside, the weights
rounded once to the output's dtype, the ids int64 as torch.topk's. The k picks are
argmaxes in turn, so of tied experts the lowest id comes first.
"""

import torch
import triton
import triton.language as tl

from pagedllm._triton_ops.launch import for_device


@triton.jit
def topk_softmax_kernel(
    logits_ptr,
    weights_ptr,
    ids_ptr,
    num_experts,
    stride_logits,
    TOP_K: tl.constexpr,
    TOP_K_PADDED: tl.constexpr,  # a power of two >= TOP_K
    EXPERTS: tl.constexpr,  # a power of two >= num_experts
    RENORMALIZE: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    experts = tl.arange(0, EXPERTS)
    mask = experts < num_experts
    logits = tl.load(logits_ptr + token * stride_logits + experts, mask=mask, other=0.0)
    logits = tl.where(mask, logits.to(tl.float32), float("-inf"))
    exp = tl.exp(logits - tl.max(logits, axis=0))
    probs = exp / tl.sum(exp, axis=0)
    picks = tl.arange(0, TOP_K_PADDED)
    top_probs = tl.zeros((TOP_K_PADDED,), dtype=tl.float32)
    top_ids = tl.zeros((TOP_K_PADDED,), dtype=tl.int64)
    remaining = tl.where(mask, probs, -1.0)
    for k in tl.static_range(TOP_K):
        best = tl.argmax(remaining, axis=0)
        top_probs = tl.where(picks == k, tl.max(remaining, axis=0), top_probs)
        top_ids = tl.where(picks == k, best.to(tl.int64), top_ids)
        remaining = tl.where(experts == best, -1.0, remaining)
    if RENORMALIZE:  # the padded picks hold 0
        top_probs = top_probs / tl.sum(top_probs, axis=0)
    out = token * TOP_K + picks
    tl.store(weights_ptr + out, top_probs.to(weights_ptr.dtype.element_ty), mask=picks < TOP_K)
    tl.store(ids_ptr + out, top_ids, mask=picks < TOP_K)


def topk_softmax(
    router_logits: torch.Tensor, top_k: int, renormalize: bool, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits [T, E] -> (weights [T, top_k] in `dtype`, ids [T, top_k] int64), the
    largest probabilities first."""
    tokens, num_experts = router_logits.shape
    weights = torch.empty(tokens, top_k, dtype=dtype, device=router_logits.device)
    ids = torch.empty(tokens, top_k, dtype=torch.int64, device=router_logits.device)
    if tokens:
        logits = router_logits if router_logits.stride(1) == 1 else router_logits.contiguous()
        for_device(topk_softmax_kernel, logits.device)[(tokens,)](
            logits,
            weights,
            ids,
            num_experts,
            logits.stride(0),
            TOP_K=top_k,
            TOP_K_PADDED=triton.next_power_of_2(top_k),
            EXPERTS=triton.next_power_of_2(num_experts),
            RENORMALIZE=renormalize,
        )
    return weights, ids


def applies(top_k: int, num_experts: int) -> bool:
    """Whether the kernel takes this routing: experts few enough for one program's
    registers, top_k at most their count (each pick is a pass over them)."""
    return 0 < top_k <= min(num_experts, 64) and num_experts <= 4096
