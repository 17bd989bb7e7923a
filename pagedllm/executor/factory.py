"""make_executor: the executor a config asks for."""

import os

from pagedllm.config import EngineConfig
from pagedllm.executor.executor import Executor
from pagedllm.executor.multiproc_executor import MultiprocExecutor
from pagedllm.executor.torchrun_executor import TorchrunExecutor, torchrun_rank


def make_executor(config: EngineConfig) -> Executor:
    tp = config.parallel_config.tensor_parallel_size
    if torchrun_rank() is not None:
        world_size = int(os.environ["WORLD_SIZE"])
        if world_size != tp:
            raise ValueError(
                f"torchrun started {world_size} ranks but tensor_parallel_size is {tp}"
            )
        return TorchrunExecutor(config)
    return MultiprocExecutor(config) if tp > 1 else Executor(config)
