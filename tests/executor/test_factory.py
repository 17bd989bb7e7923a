"""make_executor (pagedllm/executor/factory.py). Reference: its rule: under torchrun (WORLD_SIZE
> 1 and RANK set) a TorchrunExecutor, whose world must be tensor_parallel_size ranks; otherwise
MultiprocExecutor for tensor_parallel_size > 1, the in-process Executor for 1."""

import dataclasses
import sys
from collections.abc import Callable

import pytest
import torch

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
    message = (
        f"torchrun started {world_size} ranks but tensor_parallel_size {tp} x "
        f"pipeline_parallel_size 1 is {tp}"
    )
    with pytest.raises(ValueError, match=message):
        make_executor(config(tp))


@pytest.mark.parametrize(
    "world_size, local_ranks, gpus, fits",
    [(None, None, 1, False), (None, None, 2, True), (4, 2, 2, True), (4, 2, 1, False)],
)
def test_cuda_ranks_need_a_gpu_each_on_their_machine(
    config, launched, monkeypatch, world_size, local_ranks, gpus, fits
) -> None:
    """Without torchrun all tensor_parallel_size ranks share this machine; under torchrun,
    LOCAL_WORLD_SIZE of them."""
    monkeypatch.setattr(factory, "MultiprocExecutor", stub("multiproc"))
    monkeypatch.setattr(factory, "TorchrunExecutor", stub("torchrun"))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    launched(world_size)
    if local_ranks is not None:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local_ranks))
    tp = world_size or 2
    on_cuda = dataclasses.replace(config(tp), device="cuda")
    if fits:
        assert make_executor(on_cuda)[1] is on_cuda
        return
    ranks = local_ranks or tp
    message = f"tensor_parallel_size {tp} x pipeline_parallel_size 1 puts {ranks} ranks on this "
    message += "machine, one GPU each; "
    with pytest.raises(ValueError, match=message + f"torch finds {gpus}"):
        make_executor(on_cuda)


@pytest.mark.parametrize(
    "backend, tp, executor",
    [(None, 1, "uni"), (None, 2, "multiproc"), ("mp", 1, "multiproc"), ("ray", 2, "ray")],
)
def test_distributed_executor_backend_picks_the_executor(
    tiny_model_path, launched, monkeypatch, backend, tp, executor
) -> None:
    """vLLM's --distributed-executor-backend: "mp" spawns even one rank's worker-less world,
    "ray" places actors; without it one rank runs in process and more are spawned."""
    from pagedllm.executor import ray_executor

    monkeypatch.setattr(factory, "MultiprocExecutor", stub("multiproc"))
    monkeypatch.setattr(factory, "Executor", stub("uni"))
    monkeypatch.setattr(ray_executor, "RayExecutor", stub("ray"))
    launched(None)
    args = EngineArgs(tiny_model_path("llama-gqa4"), dtype="float32", device="cpu")
    args.tensor_parallel_size, args.distributed_executor_backend = tp, backend
    made = args.create_engine_config()
    assert make_executor(made) == (executor, made)


def test_external_launcher_needs_torchrun(config, launched) -> None:
    launched(None)
    made = config(2)
    made.parallel_config.distributed_executor_backend = "external_launcher"
    with pytest.raises(ValueError, match="is torchrun: launch the script with torchrun"):
        make_executor(made)


def test_ray_backend_without_ray_says_how_to_install_it(monkeypatch) -> None:
    from pagedllm.executor.ray_utils import import_ray

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(ImportError, match=r'pip install "pagedllm\[ray\]"'):
        import_ray()
