"""Records when a rank's model runner works on a step, for the pipeline overlap test: each
call of ModelRunner.forward_stage / execute appends `start end` (time.monotonic, one clock
for every process of the machine) to <BUSY_DIR>/rank<rank>.txt."""

import functools
import os
import time
from collections.abc import Callable

from pagedllm.executor import worker
from pagedllm.executor.model_runner import ModelRunner

BUSY_DIR = "PAGEDLLM_TEST_BUSY_DIR"


def record_busy(rank: int) -> None:
    path = os.path.join(os.environ[BUSY_DIR], f"rank{rank}.txt")
    for name in ("forward_stage", "execute"):
        setattr(ModelRunner, name, _timed(getattr(ModelRunner, name), path))


def _timed(method: Callable, path: str) -> Callable:
    @functools.wraps(method)
    def run(*args, **kwargs):
        start = time.monotonic()
        result = method(*args, **kwargs)
        with open(path, "a") as f:
            f.write(f"{start} {time.monotonic()}\n")
        return result

    return run


def timed_worker_main(config, rank, world_size, init_method, conn) -> None:  # noqa: ANN001
    record_busy(rank)
    worker.worker_main(config, rank, world_size, init_method, conn)


def read_busy(folder: str, rank: int) -> list[tuple[float, float]]:
    with open(os.path.join(folder, f"rank{rank}.txt")) as f:
        return [tuple(map(float, line.split())) for line in f]
