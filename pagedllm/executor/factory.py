"""make_executor: the executor a config asks for."""

import os

import torch

from pagedllm.config import EngineConfig
from pagedllm.executor.executor import Executor
from pagedllm.executor.multiproc_executor import MultiprocExecutor
from pagedllm.executor.torchrun_executor import TorchrunExecutor, torchrun_rank


def make_executor(config: EngineConfig) -> Executor:
    parallel = config.parallel_config
    if torchrun_rank() is not None:
        world_size = int(os.environ["WORLD_SIZE"])
        if world_size != parallel.world_size:
            raise ValueError(
                f"torchrun started {world_size} ranks but tensor_parallel_size "
                f"{parallel.tensor_parallel_size} x pipeline_parallel_size "
                f"{parallel.pipeline_parallel_size} is {parallel.world_size}"
            )
        check_gpus_for_ranks(config, int(os.environ.get("LOCAL_WORLD_SIZE", world_size)))
        return TorchrunExecutor(config)
    check_gpus_for_ranks(config, parallel.world_size)
    return MultiprocExecutor(config) if parallel.world_size > 1 else Executor(config)


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
