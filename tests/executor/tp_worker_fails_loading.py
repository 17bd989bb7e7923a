"""Run as a script: tensor-parallel worker 1 raises while it loads its shard; LLM() must
raise that error at once and leave no worker behind. Prints the error, the seconds LLM()
took and how many worker processes are still alive.

Spawned workers re-import this file as `__mp_main__`, so the patch below applies in them.
"""

import multiprocessing
import sys
import time

import torch.distributed as dist

from pagedllm import LLM
from pagedllm.config import EngineConfig
from pagedllm.executor.model_runner import ModelRunner

build_runner = ModelRunner.__init__


def init_failing_on_workers(self: ModelRunner, config: EngineConfig) -> None:
    if dist.get_rank() > 0:
        raise MemoryError("injected: the shard does not fit on this worker")
    build_runner(self, config)


ModelRunner.__init__ = init_failing_on_workers

if __name__ == "__main__":
    start = time.monotonic()
    try:
        LLM(sys.argv[1], tensor_parallel_size=2, skip_tokenizer_init=True, num_kv_blocks=256)
    except RuntimeError as e:
        print("ERROR", e)
    print("SECONDS", time.monotonic() - start)
    print("LIVE_WORKERS", len(multiprocessing.active_children()))
