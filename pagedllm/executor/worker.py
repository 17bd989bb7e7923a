"""Workers: ranks 1..N-1 run the model on their shard, following rank 0's messages.

Rank 0 (the engine's process) sends each control message, `(method, argument)`, on its
way (stage_link.py); the ranks of a stage run the same forward, whose collectives
(all-reduce, all-gather) carry the tensors. Under pipeline parallelism a stage runs its
layers on what the stage before sent and sends its own output on; the last stage's
tensor-parallel rank 0 samples, from the rows it keeps across steps (row_deltas.py), and
returns the step's output to rank 0. Without pipeline parallelism rank 0 samples.
"""

import dataclasses
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
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
from pagedllm.executor.model_runner import ModelRunner, StepInput
from pagedllm.executor.row_deltas import PersistentRows, RowDelta
from pagedllm.executor.stage_link import StageLink
from pagedllm.executor.table_deltas import BlockTableReceiver

SHUTDOWN = "shutdown"
INIT_KV_CACHE = "init_kv_cache"
KV_CACHE_BYTES = "kv_cache_bytes"  # every rank: the most KV bytes per token of any rank
PROFILE_RUN = "profile_run"  # every rank: the least KV cache bytes of any rank's GPU
EXECUTE = "execute"  # argument: (StepInput, its rows' list[RowDelta], or None: rank 0 samples)

# Start-up reports a spawned worker sends rank 0 over its pipe, in this order. A worker that
# exits before STARTED never ran worker_main: it failed while re-importing the main module.
STARTED = "started"
JOINED = "joined"  # it is in the process group
READY = "ready"  # its shard is loaded, so it is in the control loop
ERROR = "error"  # its traceback; the last thing it sends


def shutdown_barrier() -> None:
    """Every rank, once the shutdown message is out: rank 0 waits here until all have heard
    it, so that closing the process group cannot cut the message off on its way to another
    node (DistributedExecutor._send_shutdown)."""
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
    link = StageLink(runner.device)
    persistent = PersistentRows(runner.device) if link.samples else None
    tables = BlockTableReceiver()
    while True:
        method, argument = link.receive_message()
        if method == SHUTDOWN:
            link.pending.wait()  # the message on its way to the next stage
            shutdown_barrier()
            return
        if method == INIT_KV_CACHE:
            runner.init_kv_cache(argument)
        elif method == KV_CACHE_BYTES:
            link.max_over_ranks(runner.kv_cache_bytes_per_token)
        elif method == PROFILE_RUN:
            link.max_over_ranks(-runner.available_kv_cache_bytes(sample=False))
        elif method == EXECUTE:
            step, deltas = argument
            run_step(runner, link, persistent, tables.decode(step), deltas)
        else:
            raise RuntimeError(f"unknown control message {method!r}")


def die_with_parent() -> None:
    """Exit when the parent process (rank 0, or the server of a data-parallel replica)
    is gone, however it ended, so no process is left orphaned: a thread waits on the
    parent's sentinel. (Linux's PR_SET_PDEATHSIG would fire when the parent's *thread* that
    started this process ends: an LLM built in a thread that returns would lose its
    workers.) A parent that died while this one was still importing exits here."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return
    if not parent.is_alive():
        raise SystemExit(1)

    def exit_with_parent() -> None:
        multiprocessing.connection.wait([parent.sentinel])
        os._exit(1)

    threading.Thread(target=exit_with_parent, name="pagedllm-parent-watch", daemon=True).start()


def worker_main(
    config: EngineConfig, rank: int, world_size: int, init_method: str, conn: Connection
) -> None:
    """Entry point of a spawned worker process; reports its traceback to rank 0 on error."""
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is rank 0's to handle
    conn.send((STARTED, None))
    try:
        backend = distributed_backend(config.device)
        per_node = world_size // config.parallel_config.nnodes  # --nnodes: consecutive ranks
        device = rank_device(config.device, rank % per_node, per_node)
        config = dataclasses.replace(config, device=device)
        init_distributed_environment(
            world_size,
            rank,
            init_method,
            backend,
            pipeline_parallel_size=config.parallel_config.pipeline_parallel_size,
        )
        conn.send((JOINED, None))
        runner = ModelRunner(config)
        conn.send((READY, None))
        run_worker_loop(runner)
    except BaseException:  # noqa: BLE001 - everything goes back to rank 0
        conn.send((ERROR, traceback.format_exc()))
        raise SystemExit(1) from None
    finally:
        destroy_distributed_environment()


def run_step(
    runner: ModelRunner,
    link: StageLink,
    persistent: PersistentRows | None,
    step: StepInput,
    deltas: list[RowDelta] | None,
) -> None:
    """This rank's part of one step (rank 0's first stage runs in the executor).
    `persistent`: the sampling rank's rows, which `deltas` bring up to date."""
    intermediate = link.recv_intermediate()
    if not link.pp.is_last_rank:
        link.send_intermediate(runner.forward_stage(step, intermediate))
    elif link.samples:
        rows = persistent.apply(deltas, step.finished_req_ids)
        link.send_output(runner.execute(step, rows, intermediate))
    else:
        runner.follow(step, intermediate)
