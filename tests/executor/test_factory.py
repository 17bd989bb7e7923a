"""make_executor (pagedllm/executor/factory.py). Reference: its rule: under torchrun (WORLD_SIZE
> 1 and RANK set) a TorchrunExecutor, whose world must be tensor_parallel_size ranks; otherwise
MultiprocExecutor for tensor_parallel_size > 1, the in-process Executor for 1."""

from collections.abc import Callable

import pytest

from pagedllm.config import EngineConfig
from pagedllm.engine.arg_utils import EngineArgs
from pagedllm.executor import factory
from pagedllm.executor.executor import Executor
from pagedllm.executor.factory import make_executor


@pytest.fixture
def config(tiny_model_path: Callable[[str], str]) -> Callable[[int], EngineConfig]:
    def make(tp: int) -> EngineConfig:
        args = EngineArgs(tiny_model_path("llama-gqa4"), dtype="float32", device="cpu")
        args.tensor_parallel_size = tp
        return args.create_engine_config()

    return make


@pytest.fixture
def launched(monkeypatch: pytest.MonkeyPatch) -> Callable[[int | None], None]:
    """launched(world_size) sets torchrun's variables for rank 0; launched(None) clears them."""

    def launch(world_size: int | None) -> None:
        for name in ("WORLD_SIZE", "RANK"):
            monkeypatch.delenv(name, raising=False)
        if world_size is not None:
            monkeypatch.setenv("WORLD_SIZE", str(world_size))
            monkeypatch.setenv("RANK", "0")

    return launch


def stub(name: str) -> Callable[[EngineConfig], tuple[str, EngineConfig]]:
    return lambda config: (name, config)


def test_tp1_runs_in_process(config, launched) -> None:
    launched(None)
    assert type(make_executor(config(1))) is Executor


@pytest.mark.parametrize("world_size, executor", [(None, "multiproc"), (2, "torchrun")])
def test_tp2_spawns_workers_unless_torchrun_launched_them(
    config, launched, monkeypatch, world_size, executor
) -> None:
    monkeypatch.setattr(factory, "MultiprocExecutor", stub("multiproc"))
    monkeypatch.setattr(factory, "TorchrunExecutor", stub("torchrun"))
    launched(world_size)
    tp2 = config(2)
    assert make_executor(tp2) == (executor, tp2)


@pytest.mark.parametrize("tp, world_size", [(1, 2), (2, 4)])
def test_torchrun_world_must_be_the_tensor_parallel_size(config, launched, tp, world_size) -> None:
    launched(world_size)
    message = f"torchrun started {world_size} ranks but tensor_parallel_size is {tp}"
    with pytest.raises(ValueError, match=message):
        make_executor(config(tp))
