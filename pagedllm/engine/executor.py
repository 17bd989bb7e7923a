"""Executors run the model for the engine: in-process (tp = 1) or across tensor-parallel
processes (tp > 1), spawned here or launched by torchrun (env:// variables)."""

import dataclasses
import multiprocessing as mp
import os
import socket
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from multiprocessing.connection import Connection, wait

from pagedllm.config import EngineConfig
from pagedllm.distributed.parallel_state import (
    destroy_distributed_environment,
    init_distributed_environment,
)
from pagedllm.engine.model_runner import ModelRunner, StepInput, StepOutput
from pagedllm.engine.worker import (
    ERROR,
    EXECUTE,
    INIT_KV_CACHE,
    JOINED,
    READY,
    SHUTDOWN,
    broadcast_message,
    distributed_backend,
    rank_device,
    run_worker_loop,
    worker_main,
)
from pagedllm.sample.metadata import SamplingRow

WORKER_START_TIMEOUT_S = 300.0  # a healthy worker loading a large shard; failures show at once
_POLL_S = 0.05  # how often start-up checks whether rank 0's own rendezvous has finished
BOOTSTRAP_ADVICE = (
    'put the code that creates the LLM under `if __name__ == "__main__":`, since each '
    "tensor-parallel worker is a spawned process that re-imports the main module"
)


class Executor:
    """tp = 1: the model runs in this process."""

    def __init__(self, config: EngineConfig) -> None:
        self.runner = ModelRunner(config)

    @property
    def kv_cache_bytes_per_token(self) -> int:
        return self.runner.kv_cache_bytes_per_token

    def init_kv_cache(self, num_blocks: int) -> None:
        self.runner.init_kv_cache(num_blocks)

    def execute(self, step: StepInput, rows: list[SamplingRow]) -> StepOutput:
        return self.runner.execute(step, rows)

    def is_healthy(self) -> bool:
        """Whether the executor can run another step after one failed: a single process
        has no part that can die on its own."""
        return True

    def shutdown(self) -> None:
        """Nothing to stop in one process."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DistributedExecutor(Executor):
    """Rank 0 of a tensor-parallel world: each call is broadcast, then run here too."""

    def _call(self, method: str, argument: object) -> None:
        broadcast_message((method, argument))

    def init_kv_cache(self, num_blocks: int) -> None:
        self._call(INIT_KV_CACHE, num_blocks)
        super().init_kv_cache(num_blocks)

    def execute(self, step: StepInput, rows: list[SamplingRow]) -> StepOutput:
        self._call(EXECUTE, step)
        return super().execute(step, rows)

    def shutdown(self) -> None:
        self._call(SHUTDOWN, None)
        destroy_distributed_environment()


class MultiprocExecutor(DistributedExecutor):
    """Rank 0 here, ranks 1..N-1 in spawned processes; tensors move by torch.distributed.

    Start-up never hangs on a worker that dies or raises: rank 0 joins the process group in
    a thread while it watches the workers' pipes and exit sentinels, loads its own shard,
    then waits for each worker's READY (its shard is loaded) the same way, and raises with
    the worker's traceback, or its exit code, as soon as one fails.
    """

    def __init__(self, config: EngineConfig) -> None:
        _check_not_bootstrapping()
        world_size = config.parallel_config.tensor_parallel_size
        init_method = f"tcp://127.0.0.1:{_free_port()}"
        self.processes: list[mp.Process] = []
        self.conns: list[Connection] = []
        self._stage: dict[int, str] = {}  # rank -> the last start-up report it sent
        self._stopping = {"graceful": False}
        self._finalizer = weakref.finalize(self, _stop_workers, self.processes, self._stopping)
        try:
            deadline = time.monotonic() + WORKER_START_TIMEOUT_S
            self._spawn_workers(config, world_size, init_method)
            backend = distributed_backend(config.device)
            rendezvous = _in_daemon_thread(
                lambda: init_distributed_environment(world_size, 0, init_method, backend)
            )
            self._watch_workers(JOINED, rendezvous.done, deadline)
            rendezvous.result()
            device = rank_device(config.device, 0, world_size)
            super().__init__(dataclasses.replace(config, device=device))
            self._watch_workers(READY, lambda: not self._behind(READY), deadline)
        except BaseException:
            self.shutdown()
            raise

    def _spawn_workers(self, config: EngineConfig, world_size: int, init_method: str) -> None:
        """Start ranks 1..world_size-1, each with a pipe for its start-up reports. This
        process closes its copy of the child's end, so a worker's exit reads as EOF."""
        ctx = mp.get_context("spawn")
        for rank in range(1, world_size):
            parent_conn, child_conn = ctx.Pipe(duplex=False)
            process = ctx.Process(
                target=worker_main,
                args=(config, rank, world_size, init_method, child_conn),
                name=f"pagedllm-tp-worker-{rank}",
                daemon=True,
            )
            process.start()
            child_conn.close()
            self.processes.append(process)
            self.conns.append(parent_conn)

    def _behind(self, stage: str) -> list[int]:
        """The workers whose last start-up report is not `stage`."""
        return [rank for rank in range(1, len(self.conns) + 1) if self._stage.get(rank) != stage]

    def _watch_workers(self, stage: str, done: Callable[[], bool], deadline: float) -> None:
        """Poll the workers until `done()`; raise as soon as one not yet at `stage` reports an
        error or exits. Reports past `stage` stay in the pipe, so a worker's error while it
        loads its shard waits until rank 0 has loaded its own: a bad argument, which fails
        on every rank, is then raised by rank 0 itself."""
        while not done():
            behind = self._behind(stage)
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"tensor-parallel workers {behind} did not report {stage!r} within "
                    f"{WORKER_START_TIMEOUT_S:.0f} s"
                )
            waitables = {
                waitable: rank
                for rank in behind
                for waitable in (self.conns[rank - 1], self.processes[rank - 1].sentinel)
            }
            for ready in wait(list(waitables), timeout=_POLL_S):
                self._receive(waitables[ready], stage)

    def _receive(self, rank: int, stage: str) -> None:
        """Take worker `rank`'s start-up reports up to `stage`; raise if it sent an error or
        its pipe hit EOF (it exited). A sentinel can fire a moment before the EOF shows: the
        next poll sees it again."""
        conn = self.conns[rank - 1]
        try:
            while self._stage.get(rank) != stage and conn.poll():
                kind, detail = conn.recv()
                if kind == ERROR:
                    raise RuntimeError(f"tensor-parallel worker {rank} failed to start:\n{detail}")
                self._stage[rank] = kind
        except EOFError:
            raise self._silent_exit(rank) from None

    def _silent_exit(self, rank: int) -> RuntimeError:
        """A worker exited while starting without a report: killed (e.g. out of memory), or,
        before it sent STARTED, failed while re-importing the main module."""
        process = self.processes[rank - 1]
        process.join(timeout=5)  # its pipe closes just before it can be reaped
        code = process.exitcode
        if rank in self._stage:
            return RuntimeError(
                f"tensor-parallel worker {rank} died while starting (exit code {code})"
            )
        return RuntimeError(
            f"tensor-parallel worker {rank} died before it started (exit code {code}; its error "
            f"is printed above). If the script creates the LLM at module level, {BOOTSTRAP_ADVICE}"
        )

    def _call(self, method: str, argument: object) -> None:
        try:
            super()._call(method, argument)
        except RuntimeError as e:
            raise self._worker_failure(e) from e

    def _worker_failure(self, error: BaseException) -> RuntimeError:
        """A collective failed: name the worker that died and show its traceback."""
        time.sleep(0.2)  # let a failing worker's report arrive
        for rank, (process, conn) in enumerate(zip(self.processes, self.conns), start=1):
            detail = _report(conn)
            if detail or not process.is_alive():
                why = detail or f"exit code {process.exitcode}"
                return RuntimeError(f"tensor-parallel worker {rank} died ({error}):\n{why}")
        return RuntimeError(f"tensor-parallel collective failed: {error}")

    def execute(self, step: StepInput, rows: list[SamplingRow]) -> StepOutput:
        try:
            return super().execute(step, rows)
        except RuntimeError as e:
            if self.is_healthy():
                raise
            raise self._worker_failure(e) from e

    def is_healthy(self) -> bool:
        return all(p.is_alive() for p in self.processes)

    def shutdown(self) -> None:
        """Tell the workers to stop if all are in the control loop, then wait for (or kill)
        them; a worker still starting cannot take the message."""
        if not self._behind(READY) and self.is_healthy():
            try:
                broadcast_message((SHUTDOWN, None))
                self._stopping["graceful"] = True
            except RuntimeError:
                pass
        self._finalizer()


def _check_not_bootstrapping() -> None:
    """A spawned worker re-imports the main module; if that module creates the LLM outside
    the main guard, the worker gets here while multiprocessing is still bootstrapping it
    (the flag multiprocessing itself checks) and would otherwise fail obscurely."""
    if getattr(mp.current_process(), "_inheriting", False):
        raise RuntimeError(
            "an LLM was created while a tensor-parallel worker re-imported the main module: "
            + BOOTSTRAP_ADVICE
        )


def _in_daemon_thread(fn: Callable[[], None]) -> Future:
    """Run `fn` in a daemon thread so the caller can watch the workers meanwhile; a
    rendezvous left waiting for a dead worker then cannot keep the interpreter alive."""
    future: Future = Future()

    def run() -> None:
        try:
            future.set_result(fn())
        except BaseException as e:  # noqa: BLE001 - the caller re-raises it via result()
            future.set_exception(e)

    threading.Thread(target=run, name="pagedllm-tp-rendezvous", daemon=True).start()
    return future


def _report(conn: Connection) -> str | None:
    """A worker's error report, if it sent one before its pipe closed."""
    try:
        return conn.recv()[1] if conn.poll() else None
    except EOFError:
        return None


def _stop_workers(processes: list[mp.Process], stopping: dict[str, bool]) -> None:
    """Wait for workers told to shut down; kill the others (the executor was dropped
    without shutdown, or a worker hangs). Also runs at interpreter exit."""
    for process in processes:
        process.join(timeout=5 if stopping["graceful"] else 0)
        if process.is_alive():
            process.kill()
            process.join(timeout=5)
    destroy_distributed_environment()


class TorchrunExecutor(DistributedExecutor):
    """Rank 0 of a world launched by torchrun; the other ranks run `run_torchrun_worker`."""

    def __init__(self, config: EngineConfig) -> None:
        init_distributed_environment(
            int(os.environ["WORLD_SIZE"]), 0, "env://", distributed_backend(config.device)
        )
        super().__init__(dataclasses.replace(config, device=_torchrun_device(config)))


def _torchrun_device(config: EngineConfig) -> str:
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    return rank_device(config.device, local_rank, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def run_torchrun_worker(config: EngineConfig) -> None:
    """Ranks > 0 under torchrun: follow rank 0 until it shuts down."""
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    init_distributed_environment(world_size, rank, "env://", distributed_backend(config.device))
    try:
        run_worker_loop(ModelRunner(dataclasses.replace(config, device=_torchrun_device(config))))
    finally:
        destroy_distributed_environment()


def torchrun_rank() -> int | None:
    """This process's rank when launched by torchrun with more than one rank, else None."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and "RANK" in os.environ:
        return int(os.environ["RANK"])
    return None


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
