"""pagedllm/distributed/parallel_state.py in one process. Reference: torch.distributed's own
answers (get_rank / get_world_size) once a gloo group of 1 rank is initialised, and its
definition of a single process without a group: rank 0 of 1."""

import os
from pathlib import Path

import pytest
import torch.distributed as dist

from pagedllm.distributed import parallel_state
from pagedllm.distributed.parallel_state import (
    GroupCoordinator,
    destroy_distributed_environment,
    get_cpu_group,
    get_expert_parallel_rank,
    get_expert_parallel_world_size,
    get_pp_group,
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    get_tp_group,
    init_distributed_environment,
    override_pipeline_parallel,
    override_tensor_parallel,
    set_expert_parallel,
)


def test_without_a_group_the_process_is_rank_0_of_1() -> None:
    assert not dist.is_initialized()
    assert (get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()) == (0, 1)


def test_override_sets_rank_and_size_and_restores_them_when_nested() -> None:
    with override_tensor_parallel(3, 8):
        assert (get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()) == (3, 8)
        with override_tensor_parallel(1, 2):
            assert get_tensor_model_parallel_rank() == 1
            assert get_tensor_model_parallel_world_size() == 2
        assert (get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()) == (3, 8)
    assert (get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()) == (0, 1)


def test_override_is_restored_after_an_error() -> None:
    with pytest.raises(RuntimeError), override_tensor_parallel(1, 4):
        raise RuntimeError("building a layer failed")
    assert get_tensor_model_parallel_world_size() == 1


@pytest.mark.parametrize("rank, world_size", [(2, 2), (-1, 2), (0, 0)])
def test_override_rejects_a_rank_outside_the_world(rank: int, world_size: int) -> None:
    with pytest.raises(ValueError, match=rf"rank {rank} is outside \[0, {world_size}\)"):
        with override_tensor_parallel(rank, world_size):
            pass


def test_gloo_group_of_one_rank(gloo_group_of_one: None) -> None:
    assert dist.is_initialized() and dist.get_backend() == "gloo"
    assert get_tensor_model_parallel_rank() == dist.get_rank() == 0
    assert get_tensor_model_parallel_world_size() == dist.get_world_size() == 1
    assert get_cpu_group() is dist.group.WORLD  # gloo tensors: no second group


def test_override_wins_over_an_initialised_group(gloo_group_of_one: None) -> None:
    with override_tensor_parallel(1, 2):
        assert (get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()) == (1, 2)


def test_destroy_leaves_no_group_and_cpu_group_needs_init(tmp_path: Path) -> None:
    init_distributed_environment(1, 0, init_method=f"file://{tmp_path / 'rendezvous'}")
    destroy_distributed_environment()
    assert not dist.is_initialized() and parallel_state._cpu_group is None
    destroy_distributed_environment()  # a second call is harmless
    with pytest.raises(AssertionError, match="init_distributed_environment"):
        get_cpu_group()


def test_destroy_joins_the_groups_threads_while_the_interpreter_runs(tmp_path: Path) -> None:
    """The groups' handles go with the world, so gloo's worker threads are joined at once:
    left to interpreter exit, a worker freeing a collective's Python tensors aborts it."""
    threads = lambda: len(os.listdir("/proc/self/task"))  # noqa: E731
    before = threads()
    init_distributed_environment(1, 0, init_method=f"file://{tmp_path / 'rendezvous'}")
    tp, pp = get_tp_group(), get_pp_group()
    dist.broadcast_object_list([("step", 1)], src=0, group=get_cpu_group())
    assert threads() > before
    destroy_distributed_environment()
    assert tp.cpu_group is tp.device_group is pp.cpu_group is pp.device_group is None
    assert threads() <= before


def test_pipeline_override_sets_the_stage_and_leaves_tensor_parallel_alone() -> None:
    with override_pipeline_parallel(1, 2), override_tensor_parallel(3, 4):
        pp = get_pp_group()
        assert (pp.rank_in_group, pp.world_size, pp.is_first_rank, pp.is_last_rank) == (
            1,
            2,
            False,
            True,
        )
        assert get_tensor_model_parallel_world_size() == 4
    assert get_pp_group().world_size == 1 and get_pp_group().is_first_rank


def test_group_coordinator_neighbours() -> None:
    """vLLM's layout, tp 2 x pp 3: rank 3 is tp rank 1 of stage 1, its pipeline [1, 3, 5]."""
    group = GroupCoordinator((1, 3, 5), 1)
    assert (group.prev_rank, group.next_rank, group.first_rank, group.last_rank) == (1, 5, 1, 5)


def test_gloo_group_of_one_has_pipeline_and_tensor_groups_of_one(gloo_group_of_one) -> None:
    assert get_pp_group().ranks == (0,) and get_tp_group().ranks == (0,)
    assert get_pp_group().is_first_rank and get_pp_group().is_last_rank


def test_expert_parallel_group_is_the_tensor_parallel_group_while_enabled() -> None:
    """vLLM's EP group with TP x DP = TP: EP rank and size are TP's; off, every rank holds
    every expert (rank 0 of 1). The setting nests and is restored after an error."""
    with override_tensor_parallel(3, 4):
        assert (get_expert_parallel_rank(), get_expert_parallel_world_size()) == (0, 1)
        with set_expert_parallel(True):
            assert (get_expert_parallel_rank(), get_expert_parallel_world_size()) == (3, 4)
            with set_expert_parallel(False):
                assert get_expert_parallel_world_size() == 1
            assert get_expert_parallel_world_size() == 4
        with pytest.raises(RuntimeError), set_expert_parallel(True):
            raise RuntimeError("building a layer failed")
        assert get_expert_parallel_world_size() == 1
    with set_expert_parallel(True):
        assert (get_expert_parallel_rank(), get_expert_parallel_world_size()) == (0, 1)
