"""Token assignments sorted and padded by expert, so a block of BLOCK_SIZE_M rows has one
expert: the layout the fused MoE GEMM walks (vLLM's `moe_align_block_size`).

One Triton launch, one program per expert, and nothing read back to the host: the buffers
are sized by the worst case from host-side shapes, and the number of rows used travels as
a device tensor the GEMM reads, so a step can be captured in a CUDA graph. Each program
counts every expert's assignments (a histogram over the ids, chunk by chunk), so each
knows where its padded run starts without a second launch, then writes its own
assignments there in flat order, its padding, and its blocks' expert id.
"""

import torch
import triton
import triton.language as tl

from pagedllm._triton_ops.launch import for_device


# Not specialized on the step's counts (see fused_moe.py).
@triton.jit(do_not_specialize=["num_assignments", "num_blocks"])
def moe_align_block_size_kernel(
    topk_ids_ptr,  # [T*K]
    sorted_ids_ptr,  # [num_blocks * BLOCK_SIZE_M]
    expert_ids_ptr,  # [num_blocks]
    num_tokens_post_padded_ptr,  # [1]
    expert_map_ptr,  # [E], read when HAS_EXPERT_MAP
    num_assignments,
    num_blocks,
    BLOCK_SIZE_M: tl.constexpr,
    EXPERTS: tl.constexpr,  # a power of two >= E
    CHUNK: tl.constexpr,
    HAS_EXPERT_MAP: tl.constexpr,
):
    expert = tl.program_id(0)
    offs = tl.arange(0, CHUNK)
    counts = tl.zeros((EXPERTS,), dtype=tl.int32)
    for start in range(0, num_assignments, CHUNK):
        mask = start + offs < num_assignments
        ids = tl.load(topk_ids_ptr + start + offs, mask=mask, other=0).to(tl.int32)
        counts += tl.histogram(ids, EXPERTS, mask=mask)
    padded = (counts + BLOCK_SIZE_M - 1) // BLOCK_SIZE_M * BLOCK_SIZE_M
    mine = tl.arange(0, EXPERTS) == expert
    end = tl.sum(tl.where(mine, tl.cumsum(padded, 0), 0))
    count = tl.sum(tl.where(mine, counts, 0))
    start_row = end - tl.sum(tl.where(mine, padded, 0))

    rank = tl.full((), 0, tl.int32)  # this expert's assignments written so far
    for start in range(0, num_assignments, CHUNK):
        mask = start + offs < num_assignments
        ids = tl.load(topk_ids_ptr + start + offs, mask=mask, other=-1)
        hit = (ids == expert).to(tl.int32)
        position = start_row + rank + tl.cumsum(hit, 0) - 1
        tl.store(sorted_ids_ptr + position, (start + offs).to(tl.int32), mask=hit == 1)
        rank += tl.sum(hit)
    pad = tl.arange(0, BLOCK_SIZE_M)
    tl.store(
        sorted_ids_ptr + start_row + count + pad,
        num_assignments,
        mask=pad < end - start_row - count,
    )
    if HAS_EXPERT_MAP:
        local_id = tl.load(expert_map_ptr + expert).to(tl.int32)
    else:
        local_id = expert
    for block in range(start_row // BLOCK_SIZE_M, end // BLOCK_SIZE_M, CHUNK):
        blocks = block + offs
        tl.store(expert_ids_ptr + blocks, local_id, mask=blocks < end // BLOCK_SIZE_M)

    if expert == 0:  # the rows and blocks past the used ones, and their count
        total = tl.sum(padded)
        tl.store(num_tokens_post_padded_ptr, total)
        for row in range(total, num_blocks * BLOCK_SIZE_M, CHUNK):
            rows = row + offs
            tl.store(sorted_ids_ptr + rows, num_assignments, mask=rows < num_blocks * BLOCK_SIZE_M)
        for block in range(total // BLOCK_SIZE_M, num_blocks, CHUNK):
            blocks = block + offs
            tl.store(expert_ids_ptr + blocks, -1, mask=blocks < num_blocks)


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
    topk_ids = topk_ids.contiguous()  # read flat
    num_assignments = topk_ids.numel()
    num_blocks = max_num_blocks(num_assignments, block_size, num_experts)
    device = topk_ids.device
    sorted_ids = torch.empty(num_blocks * block_size, dtype=torch.int32, device=device)
    expert_ids = torch.empty(num_blocks, dtype=torch.int32, device=device)
    num_post = torch.empty(1, dtype=torch.int32, device=device)
    for_device(moe_align_block_size_kernel, device)[(num_experts,)](
        topk_ids,
        sorted_ids,
        expert_ids,
        num_post,
        topk_ids if expert_map is None else expert_map,
        num_assignments,
        num_blocks,
        BLOCK_SIZE_M=block_size,
        EXPERTS=triton.next_power_of_2(num_experts),
        CHUNK=min(1024, max(16, triton.next_power_of_2(num_assignments))),
        HAS_EXPERT_MAP=expert_map is not None,
    )
    return sorted_ids, expert_ids, num_post
