"""Tensor-parallel workers: ranks 1..N-1 run the model on their shard in lockstep with rank 0.

Rank 0 (the engine's process) broadcasts each control message, `(method, argument)`, over
the gloo group; every rank then runs the same forward, whose collectives (all-reduce,
all-gather) carry the tensors. Only rank 0 samples.
"""

import ctypes
import dataclasses
import multiprocessing
import os
import signal
import traceback
from multiprocessing.connection import Connection

import torch
import torch.distributed as dist

from pagedllm.config import EngineConfig
from pagedllm.distributed.parallel_state import (
    destroy_distributed_environment,
    get_cpu_group,
    init_distributed_environment,
)
from pagedllm.executor.model_runner import ModelRunner

SHUTDOWN = "shutdown"
INIT_KV_CACHE = "init_kv_cache"
EXECUTE = "execute"

# Start-up reports a spawned worker sends rank 0 over its pipe, in this order. A worker that
# exits before STARTED never ran worker_main: it failed while re-importing the main module.
STARTED = "started"
JOINED = "joined"  # it is in the process group
READY = "ready"  # its shard is loaded, so it is in the control loop
ERROR = "error"  # its traceback; the last thing it sends


def broadcast_message(message: tuple[str, object] | None) -> tuple[str, object]:
    """Rank 0 passes the message; the other ranks pass None and receive it."""
    box = [message]
    dist.broadcast_object_list(box, src=0, group=get_cpu_group())
    return box[0]


def broadcast_shutdown() -> None:
    """Rank 0: tell every rank to stop, then wait in a barrier until all have heard it, so
    that closing the process group cannot cut the message off on its way to another node."""
    broadcast_message((SHUTDOWN, None))
    shutdown_barrier()


def shutdown_barrier() -> None:
    """Every rank, once the shutdown message is out (see broadcast_shutdown)."""
    dist.barrier(group=get_cpu_group())


def distributed_backend(device: str) -> str:
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def rank_device(device: str, local_rank: int, ranks_on_host: int = 1) -> str:
    """Each CUDA rank gets its own GPU; CPU ranks share the cores, so each takes its share
    of threads (more would oversubscribe the cores and spin in OpenMP barriers)."""
    if torch.device(device).type != "cuda":
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // ranks_on_host))
        return device
    torch.cuda.set_device(local_rank)
    return f"cuda:{local_rank}"


def run_worker_loop(runner: ModelRunner) -> None:
    """Follow rank 0's messages until it says shutdown."""
    while True:
        method, argument = broadcast_message(None)
        if method == SHUTDOWN:
            shutdown_barrier()
            return
        if method == INIT_KV_CACHE:
            runner.init_kv_cache(argument)
        elif method == EXECUTE and argument.pool_indices:
            runner.pool(argument)
        elif method == EXECUTE:
            runner.forward(argument)
        else:
            raise RuntimeError(f"unknown control message {method!r}")


def _die_with_parent() -> None:
    """Linux: get SIGKILL when the parent (rank 0) dies, so no worker is left orphaned. A
    parent that died while this worker was still importing is gone before the signal is
    armed, so that case exits here."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    parent = multiprocessing.parent_process()
    if parent is not None and not parent.is_alive():
        raise SystemExit(1)


def worker_main(
    config: EngineConfig, rank: int, world_size: int, init_method: str, conn: Connection
) -> None:
    """Entry point of a spawned worker process; reports its traceback to rank 0 on error."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is rank 0's to handle
    conn.send((STARTED, None))
    try:
        backend = distributed_backend(config.device)
        per_node = world_size // config.parallel_config.nnodes  # --nnodes: consecutive ranks
        device = rank_device(config.device, rank % per_node, per_node)
        config = dataclasses.replace(config, device=device)
        init_distributed_environment(world_size, rank, init_method, backend)
        conn.send((JOINED, None))
        runner = ModelRunner(config)
        conn.send((READY, None))
        run_worker_loop(runner)
    except BaseException:  # noqa: BLE001 - everything goes back to rank 0
        conn.send((ERROR, traceback.format_exc()))
        raise SystemExit(1) from None
    finally:
        destroy_distributed_environment()
