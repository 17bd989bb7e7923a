"""Token assignments sorted and padded by expert, so a block of BLOCK_SIZE_M rows has one
expert: the layout the fused MoE GEMM walks (vLLM's `moe_align_block_size`).

Torch ops only, and none of them reads a value back to the host: every buffer is sized by
the worst case from the host-side shapes, and the number of rows actually used travels as
a device tensor the kernel reads. So the step can be captured in a CUDA graph.
"""

import torch


def max_num_blocks(num_assignments: int, block_size: int, num_experts: int) -> int:
    """The most blocks T*K assignments can fill: each expert pads its rows up to a whole
    block, so at most cdiv(T*K, B) + E blocks, and never more than one per assignment."""
    return min(num_assignments, -(-num_assignments // block_size) + num_experts)


def moe_align_block_size(
    topk_ids: torch.Tensor,
    block_size: int,
    num_experts: int,
    expert_map: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """topk_ids [T, K] (ids in [0, num_experts)) -> (sorted_token_ids, expert_ids,
    num_tokens_post_padded), all int32 on topk_ids' device.

    sorted_token_ids [NB * B]: flat assignment indices (t * K + k), grouped by expert in
        ascending expert order, each group in ascending index order and padded to a multiple
        of B with T*K (an index no assignment has); rows past the used ones hold T*K too.
    expert_ids [NB]: the expert of each block; -1 for blocks past the used ones, and, with
        expert_map, for blocks of experts this rank does not hold.
    num_tokens_post_padded [1]: the used rows, sum over experts of their padded counts.

    NB = max_num_blocks(T*K, B, E). expert_map [E] (global id -> local id, or -1) turns
    the ids of expert_ids into local ones, as vLLM's expert parallelism does.
    """
    device = topk_ids.device
    flat = topk_ids.flatten().long()  # [T*K]
    num_assignments = flat.numel()
    num_blocks = max_num_blocks(num_assignments, block_size, num_experts)
    counts = torch.zeros(num_experts, dtype=torch.long, device=device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))  # bincount without its host sync
    padded = (counts + block_size - 1) // block_size * block_size
    padded_end = torch.cumsum(padded, 0)  # [E], where each expert's padded rows end
    order = torch.argsort(flat, stable=True)  # sorted position -> flat index
    count_start = torch.cumsum(counts, 0) - counts
    sorted_experts = flat[order]
    rank = torch.arange(num_assignments, device=device) - count_start[sorted_experts]
    rows = padded_end[sorted_experts] - padded[sorted_experts] + rank
    sorted_ids = torch.full(
        (num_blocks * block_size,), num_assignments, dtype=torch.int32, device=device
    )
    sorted_ids.scatter_(0, rows, order.to(torch.int32))
    block_start = torch.arange(num_blocks, device=device) * block_size
    expert_ids = torch.searchsorted(padded_end, block_start, right=True)
    used = block_start < padded_end[-1]
    if expert_map is not None:
        expert_ids = expert_map.long()[expert_ids.clamp(max=num_experts - 1)]
    expert_ids = torch.where(used, expert_ids, -1).to(torch.int32)
    return sorted_ids, expert_ids, padded_end[-1:].to(torch.int32)
