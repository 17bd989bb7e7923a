"""Fused MoE in Triton, as vLLM's `fused_experts`: every expert's SwiGLU MLP over its tokens
in two grouped GEMM launches, with no per-expert Python loop and no host sync.

    hidden [T, H] --(moe_align_block_size: assignments sorted, padded by expert)-->
    fused_moe_kernel(w13) -> [T*K, 2 I] -> silu_and_mul -> [T*K, I]
    fused_moe_kernel(w2, x topk weight) -> [T, K, H] -> sum over K -> [T, H]

Each program of `fused_moe_kernel` takes one BLOCK_SIZE_M block of sorted rows (all of one
expert) and one BLOCK_SIZE_N column tile, reads its rows of A by gather (row // top_k is
the token for gate/up; the assignment itself for down), multiplies by its expert's weight
tile over K with float32 accumulation, and scatters the result back to (token, k) order.
"""

import torch
import triton
import triton.language as tl

from pagedllm._triton_ops import interpreting
from pagedllm._triton_ops.activation import silu_and_mul
from pagedllm._triton_ops.fused_moe_configs import MoEConfig, get_config
from pagedllm._triton_ops.launch import for_device
from pagedllm._triton_ops.moe_align_block_size import moe_align_block_size


# The step's token count sets num_blocks and num_valid_tokens: not specialized on, so one
# kernel per block config serves every count (as in unified_attention.py).
@triton.jit(do_not_specialize=["num_blocks", "num_valid_tokens"])
def fused_moe_kernel(
    a_ptr,  # [M, K]: hidden states (top_k > 1) or one row per assignment (top_k == 1)
    b_ptr,  # [E, N, K]: the experts' weights, rows as out features
    c_ptr,  # [T*K, N]: one row per assignment
    topk_weights_ptr,  # [T*K]
    sorted_token_ids_ptr,  # [num_blocks * BLOCK_SIZE_M]
    expert_ids_ptr,  # [num_blocks]
    num_tokens_post_padded_ptr,  # [1]
    N,
    K,
    num_blocks,
    num_valid_tokens,
    stride_am,
    stride_ak,
    stride_be,
    stride_bn,
    stride_bk,
    stride_cm,
    stride_cn,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr,
    MUL_ROUTED_WEIGHT: tl.constexpr,
    top_k: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    WIDEN: tl.constexpr,
):
    # Programs run GROUP_SIZE_M row blocks down one column of weight tiles before moving
    # right, so consecutive programs share weight tiles in L2.
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    num_pid_in_group = GROUP_SIZE_M * num_pid_n
    first_pid_m = (pid // num_pid_in_group) * GROUP_SIZE_M
    group_size_m = min(num_blocks - first_pid_m, GROUP_SIZE_M)
    pid_m = first_pid_m + (pid % num_pid_in_group) % group_size_m
    pid_n = (pid % num_pid_in_group) // group_size_m
    if pid_m * BLOCK_SIZE_M >= tl.load(num_tokens_post_padded_ptr):
        return

    offs_m = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_token = tl.load(sorted_token_ids_ptr + offs_m).to(tl.int64)
    token_mask = offs_token < num_valid_tokens
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    c_ptrs = c_ptr + offs_token[:, None] * stride_cm + offs_n[None, :] * stride_cn
    c_mask = token_mask[:, None] & (offs_n[None, :] < N)
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    if expert == -1:  # an expert another rank holds: its rows contribute zeros here
        tl.store(c_ptrs, tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), c_ptr.dtype.element_ty), c_mask)
        return

    offs_k = tl.arange(0, BLOCK_SIZE_K)
    a_ptrs = a_ptr + (offs_token[:, None] // top_k) * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + expert * stride_be + offs_n[None, :] * stride_bn + offs_k[:, None] * stride_bk
    n_mask = offs_n[None, :] < N
    accumulator = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
        k_left = K - k * BLOCK_SIZE_K
        a = tl.load(a_ptrs, mask=token_mask[:, None] & (offs_k[None, :] < k_left), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_left) & n_mask, other=0.0)
        if WIDEN:
            a, b = a.to(tl.float32), b.to(tl.float32)
        accumulator = tl.dot(a, b, accumulator, input_precision=DOT_PRECISION)
        a_ptrs += BLOCK_SIZE_K * stride_ak
        b_ptrs += BLOCK_SIZE_K * stride_bk
    if MUL_ROUTED_WEIGHT:
        weight = tl.load(topk_weights_ptr + offs_token, mask=token_mask, other=0.0)
        accumulator = accumulator * weight[:, None].to(tl.float32)
    tl.store(c_ptrs, accumulator.to(c_ptr.dtype.element_ty), mask=c_mask)


def invoke_fused_moe_kernel(
    a: torch.Tensor,
    w: torch.Tensor,
    c: torch.Tensor,
    topk_weights: torch.Tensor,
    alignment: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    top_k: int,
    mul_routed_weight: bool,
    config: MoEConfig,
) -> None:
    """c[r] = a[r // top_k] @ w[expert of r]^T (x topk_weights[r]) for every assignment r,
    over the blocks `alignment` (moe_align_block_size's outputs) lays out."""
    sorted_token_ids, expert_ids, num_tokens_post_padded = alignment
    num_blocks, n = expert_ids.shape[0], w.shape[1]
    grid = (num_blocks * triton.cdiv(n, config["BLOCK_SIZE_N"]),)
    # The interpreter's tl.dot multiplies numpy arrays, and numpy holds bf16 as raw uint16
    # bits: there the tiles are widened to float32 first, which is exact, so the products
    # and their float32 sums are the GPU's.
    widen = interpreting()
    for_device(fused_moe_kernel, a.device)[grid](
        a,
        w,
        c,
        topk_weights,
        sorted_token_ids,
        expert_ids,
        num_tokens_post_padded,
        n,
        w.shape[2],
        num_blocks,
        topk_weights.numel(),
        a.stride(0),
        a.stride(1),
        w.stride(0),
        w.stride(1),
        w.stride(2),
        c.stride(0),
        c.stride(1),
        MUL_ROUTED_WEIGHT=mul_routed_weight,
        top_k=top_k,
        # float32 models ask for float32 products, not the TF32 tensor cores' 10-bit ones
        DOT_PRECISION="ieee" if a.dtype == torch.float32 or widen else "tf32",
        WIDEN=widen,
        **config,
    )


def fused_experts(
    hidden_states: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    expert_map: torch.Tensor | None = None,
    global_num_experts: int | None = None,
    config: MoEConfig | None = None,
) -> torch.Tensor:
    """hidden [T, H], w13 [E, 2 I, H] (gate rows then up rows), w2 [E, H, I], routing
    topk_weights / topk_ids [T, K] -> [T, H] = sum_k topk_weights[t, k] *
    w2[e] @ (silu(gate_e x_t) * up_e x_t) with e = topk_ids[t, k].

    With expert parallelism topk_ids are global ids in [0, global_num_experts) and
    expert_map [global_num_experts] gives each one's index in w13 / w2, or -1 for an
    expert held elsewhere (whose terms are zero here). `config` overrides the table's
    block sizes (fused_moe_configs.get_config).
    """
    num_tokens, top_k = topk_ids.shape
    num_experts, inter = w2.shape[0], w2.shape[2]
    if num_tokens == 0:
        return hidden_states.new_zeros(0, w2.shape[1])
    config = config or get_config(num_tokens, num_experts, inter, w13.dtype, w13.device)
    alignment = moe_align_block_size(
        topk_ids, config["BLOCK_SIZE_M"], global_num_experts or num_experts, expert_map
    )
    flat_weights = topk_weights.flatten()
    gate_up = hidden_states.new_empty(num_tokens * top_k, w13.shape[1])
    invoke_fused_moe_kernel(
        hidden_states, w13, gate_up, flat_weights, alignment, top_k, False, config
    )
    down = hidden_states.new_empty(num_tokens, top_k, w2.shape[1])
    invoke_fused_moe_kernel(
        silu_and_mul(gate_up),
        w2,
        down.view(-1, w2.shape[1]),
        flat_weights,
        alignment,
        1,
        True,
        config,
    )
    return down.sum(dim=1)
