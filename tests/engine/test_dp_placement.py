"""dp_placement: which replica ranks a node runs, and each replica's GPUs or cores.
(Replicas on another node, end to end: tests/entrypoints/openai/test_data_parallel_multinode.py.)"""

import os

import pytest

from pagedllm.engine.arg_utils import EngineArgs
from pagedllm.engine.dp_placement import (
    cpu_share,
    gpu_share,
    local_ranks,
    replica_environment,
)


@pytest.mark.parametrize(
    ("size", "local", "start", "ranks"),
    [
        (2, None, 0, range(2)),
        (4, 2, 0, range(2)),
        (4, 2, 2, range(2, 4)),
        (4, None, 1, range(1, 4)),
    ],
)
def test_local_ranks(size: int, local: int | None, start: int, ranks: range) -> None:
    args = EngineArgs(
        data_parallel_size=size, data_parallel_size_local=local, data_parallel_start_rank=start
    )
    assert local_ranks(args) == ranks


@pytest.mark.parametrize(("size", "local", "start"), [(2, 3, 0), (4, 2, 3), (2, 0, 0), (2, 1, -1)])
def test_ranks_outside_the_size_are_refused(size: int, local: int, start: int) -> None:
    args = EngineArgs(
        data_parallel_size=size, data_parallel_size_local=local, data_parallel_start_rank=start
    )
    with pytest.raises(ValueError, match="must lie in"):
        local_ranks(args)


def test_each_replica_gets_its_own_gpus_and_cores() -> None:
    gpus = ["3", "4", "5", "6"]
    assert [gpu_share(gpus, i, 2, 2) for i in range(2)] == [["3", "4"], ["5", "6"]]
    assert gpu_share(gpus, 0, 3, 2) is None  # 6 GPUs wanted: shared
    cores = [0, 1, 2, 3, 4]
    assert [cpu_share(cores, i, 2) for i in range(2)] == [[0, 1], [2, 3]]
    assert cpu_share([0], 1, 2) is None


def test_replica_environment_sets_and_restores_cuda_visible_devices(monkeypatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    with replica_environment("cuda", 1, 2, 2):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    with replica_environment("cuda:1", 1, 2, 2), replica_environment("cpu", 1, 2, 2):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
