"""Tensor parallelism launched by torchrun (env:// variables): rank 0 runs the engine
through TorchrunExecutor, ranks > 0 enter run_torchrun_worker."""

import dataclasses
import os
from typing import NoReturn

from pagedllm.config import EngineConfig
from pagedllm.distributed.parallel_state import (
    destroy_distributed_environment,
    init_distributed_environment,
)
from pagedllm.executor.executor import DistributedExecutor
from pagedllm.executor.model_runner import ModelRunner
from pagedllm.executor.worker import distributed_backend, rank_device, run_worker_loop


class TorchrunExecutor(DistributedExecutor):
    """Rank 0 of a world launched by torchrun; the other ranks run `run_torchrun_worker`."""

    def __init__(self, config: EngineConfig) -> None:
        init_distributed_environment(
            int(os.environ["WORLD_SIZE"]),
            0,
            "env://",
            distributed_backend(config.device),
            pipeline_parallel_size=config.parallel_config.pipeline_parallel_size,
        )
        super().__init__(dataclasses.replace(config, device=_torchrun_device(config)))


def _torchrun_device(config: EngineConfig) -> str:
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    return rank_device(config.device, local_rank, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def run_torchrun_worker(config: EngineConfig) -> NoReturn:
    """The worker entry of ranks > 0 under torchrun: follow rank 0 until it shuts down,
    then exit the process (the script's code after `LLM(...)` is rank 0's alone)."""
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    init_distributed_environment(
        world_size,
        rank,
        "env://",
        distributed_backend(config.device),
        pipeline_parallel_size=config.parallel_config.pipeline_parallel_size,
    )
    try:
        run_worker_loop(ModelRunner(dataclasses.replace(config, device=_torchrun_device(config))))
    finally:
        destroy_distributed_environment()
    raise SystemExit(0)


def torchrun_rank() -> int | None:
    """This process's rank when launched by torchrun with more than one rank, else None."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and "RANK" in os.environ:
        return int(os.environ["RANK"])
    return None
