"""make_executor: the executor a config asks for (vLLM's --distributed-executor-backend)."""

import os

import torch

from pagedllm.config import EngineConfig, ParallelConfig
from pagedllm.executor.executor import Executor
from pagedllm.executor.multiproc_executor import MultiprocExecutor
from pagedllm.executor.torchrun_executor import TorchrunExecutor, torchrun_rank


def make_executor(config: EngineConfig) -> Executor:
    parallel = config.parallel_config
    backend = executor_backend(parallel)
    if backend == "external_launcher":
        world_size = int(os.environ["WORLD_SIZE"])
        if world_size != parallel.world_size:
            raise ValueError(
                f"torchrun started {world_size} ranks but tensor_parallel_size "
                f"{parallel.tensor_parallel_size} x pipeline_parallel_size "
                f"{parallel.pipeline_parallel_size} is {parallel.world_size}"
            )
        check_gpus_for_ranks(config, int(os.environ.get("LOCAL_WORLD_SIZE", world_size)))
        return TorchrunExecutor(config)
    if backend == "ray":  # Ray is an optional extra: imported only when asked for
        from pagedllm.executor.ray_executor import RayExecutor

        return RayExecutor(config)
    check_gpus_for_ranks(config, parallel.ranks_per_node)
    return MultiprocExecutor(config) if backend == "mp" else Executor(config)


def executor_backend(parallel: ParallelConfig) -> str:
    """The backend asked for; without one, torchrun's when it launched this process ("uni"
    for one rank, "mp" for more, as vLLM picks on one node)."""
    backend = parallel.distributed_executor_backend
    launched = torchrun_rank() is not None
    if backend == "external_launcher" and not launched:
        raise ValueError(
            'distributed_executor_backend "external_launcher" is torchrun: launch the script '
            "with torchrun (docs/parallelism.md)"
        )
    if backend is not None:
        return backend
    if launched:
        return "external_launcher"
    return "mp" if parallel.world_size > 1 else "uni"


def check_gpus_for_ranks(config: EngineConfig, ranks_on_host: int) -> None:
    """On CUDA each rank of this host takes its own GPU (cuda:<local rank>)."""
    if torch.device(config.device).type != "cuda" or ranks_on_host < 2:
        return
    parallel = config.parallel_config
    gpus = torch.cuda.device_count()
    if ranks_on_host > gpus:
        raise ValueError(
            f"tensor_parallel_size {parallel.tensor_parallel_size} x pipeline_parallel_size "
            f"{parallel.pipeline_parallel_size} puts {ranks_on_host} ranks on this machine, one "
            f"GPU each; torch finds {gpus}"
        )
