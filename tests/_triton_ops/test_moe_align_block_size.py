"""moe_align_block_size against a plain Python reference: each expert's assignments in
flat order, padded with T*K to a whole block, experts in ascending order."""

import pytest
import torch

pytest.importorskip("triton")

from pagedllm._triton_ops.moe_align_block_size import (  # noqa: E402
    max_num_blocks,
    moe_align_block_size,
)


def reference(topk_ids: list[list[int]], block: int, num_experts: int, expert_map: list[int]):
    flat = [e for row in topk_ids for e in row]
    sentinel = len(flat)
    rows, experts = [], []
    for e in range(num_experts):
        mine = [i for i, x in enumerate(flat) if x == e]
        if not mine:
            continue
        mine += [sentinel] * (-len(mine) % block)
        rows += mine
        experts += [expert_map[e]] * (len(mine) // block)
    return rows, experts


@pytest.mark.parametrize("num_tokens", [0, 1, 13])
@pytest.mark.parametrize("top_k, num_experts", [(1, 4), (2, 8), (8, 8)])
@pytest.mark.parametrize("block", [1, 4, 16])
def test_matches_python_reference(
    triton_device: torch.device, num_tokens: int, top_k: int, num_experts: int, block: int
) -> None:
    generator = torch.Generator().manual_seed(num_tokens * 31 + block)
    scores = torch.rand(num_tokens, num_experts, generator=generator)
    topk_ids = scores.topk(top_k, dim=-1).indices.to(triton_device)  # as routed: distinct
    sorted_ids, expert_ids, num_post = moe_align_block_size(topk_ids, block, num_experts)
    rows, experts = reference(topk_ids.tolist(), block, num_experts, list(range(num_experts)))
    num_blocks = max_num_blocks(num_tokens * top_k, block, num_experts)
    assert sorted_ids.dtype == expert_ids.dtype == num_post.dtype == torch.int32
    assert sorted_ids.shape == (num_blocks * block,) and expert_ids.shape == (num_blocks,)
    assert num_post.tolist() == [len(rows)]
    assert sorted_ids[: len(rows)].tolist() == rows
    assert (sorted_ids[len(rows) :] == num_tokens * top_k).all()
    assert expert_ids[: len(experts)].tolist() == experts
    assert (expert_ids[len(experts) :] == -1).all()


def test_all_tokens_on_one_expert_fill_several_blocks(triton_device: torch.device) -> None:
    """The others have no tokens and no blocks; the one expert pads its last block."""
    topk_ids = torch.full((10, 1), 3, device=triton_device)
    sorted_ids, expert_ids, num_post = moe_align_block_size(topk_ids, 4, 8)
    assert num_post.item() == 12
    assert sorted_ids[:12].tolist() == list(range(10)) + [10, 10]
    assert expert_ids[:3].tolist() == [3, 3, 3]
    assert (expert_ids[3:] == -1).all()


def test_expert_map_gives_local_ids_and_minus_one_elsewhere(triton_device: torch.device) -> None:
    """Reference: vLLM's expert parallelism, experts 2..5 of 8 on this rank as 0..3."""
    expert_map = torch.tensor([-1, -1, 0, 1, 2, 3, -1, -1], device=triton_device)
    topk_ids = torch.tensor([[0, 2], [5, 7], [2, 3]], device=triton_device)
    sorted_ids, expert_ids, num_post = moe_align_block_size(topk_ids, 2, 8, expert_map)
    rows, experts = reference(topk_ids.tolist(), 2, 8, expert_map.tolist())
    assert num_post.item() == len(rows)
    assert sorted_ids[: len(rows)].tolist() == rows
    assert expert_ids[: len(experts)].tolist() == experts == [-1, 0, 1, 3, -1]


def test_max_num_blocks_bounds_every_routing() -> None:
    """Worst cases: every assignment on its own expert, or all on one expert."""
    assert max_num_blocks(8, 16, 128) == 8
    assert max_num_blocks(1000, 16, 4) == 63 + 4
    assert max_num_blocks(0, 16, 4) == 0
