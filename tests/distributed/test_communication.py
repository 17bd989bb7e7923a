"""pagedllm/distributed/communication.py. References: the identity for a world of one rank
(with or without a process group), and for two gloo ranks in spawned processes the
definitions of all-reduce (the elementwise sum over ranks), all-gather (every rank's
tensor concatenated along `dim` in rank order) and broadcast (the first rank's tensor),
computed here with torch.cat and sum."""

from pathlib import Path

import torch
import torch.multiprocessing as mp

from pagedllm.distributed.communication import (
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
    tensor_model_parallel_broadcast,
)
from pagedllm.distributed.parallel_state import (
    destroy_distributed_environment,
    init_distributed_environment,
)

WORLD_SIZE = 2


def rank_tensor(rank: int) -> torch.Tensor:
    """A [2, 3] tensor that differs per rank."""
    return torch.arange(6, dtype=torch.float32).view(2, 3) + 10 * rank


def check_identity() -> None:
    x = rank_tensor(0)
    expected = x.clone()
    assert tensor_model_parallel_all_reduce(x) is x
    assert tensor_model_parallel_all_gather(x) is x
    assert tensor_model_parallel_all_gather(x, dim=0) is x
    assert tensor_model_parallel_broadcast(x) is x
    torch.testing.assert_close(x, expected, rtol=0, atol=0)


def test_world_of_one_without_a_group_is_the_identity() -> None:
    check_identity()


def test_world_of_one_gloo_group_is_the_identity(gloo_group_of_one: None) -> None:
    check_identity()


def two_rank_worker(rank: int, rendezvous: str, out_dir: str) -> None:
    """One of the two spawned ranks: saves what the collectives returned."""
    init_distributed_environment(WORLD_SIZE, rank, init_method=f"file://{rendezvous}")
    try:
        x = rank_tensor(rank)
        results = {
            "gather_last": tensor_model_parallel_all_gather(x),
            "gather_0": tensor_model_parallel_all_gather(x, dim=0),
            "gather_non_contiguous": tensor_model_parallel_all_gather(x.t(), dim=0),
            "reduce": tensor_model_parallel_all_reduce(x.clone()),
            "broadcast": tensor_model_parallel_broadcast(x.clone()),
        }
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    finally:
        destroy_distributed_environment()


def test_two_gloo_ranks_sum_and_concatenate_in_rank_order(tmp_path: Path) -> None:
    mp.spawn(
        two_rank_worker,
        args=(str(tmp_path / "rendezvous"), str(tmp_path)),
        nprocs=WORLD_SIZE,
        join=True,
    )
    parts = [rank_tensor(r) for r in range(WORLD_SIZE)]
    expected = {
        "gather_last": torch.cat(parts, dim=-1),
        "gather_0": torch.cat(parts, dim=0),
        "gather_non_contiguous": torch.cat([p.t() for p in parts], dim=0),
        "reduce": sum(parts),
        "broadcast": parts[0],
    }
    for rank in range(WORLD_SIZE):
        results = torch.load(tmp_path / f"rank{rank}.pt")
        assert set(results) == set(expected)
        for name, value in expected.items():
            torch.testing.assert_close(results[name], value, rtol=0, atol=0, msg=name)
