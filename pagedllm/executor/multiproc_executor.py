"""MultiprocExecutor: rank 0 in this process, ranks 1..N-1 spawned (multiprocessing spawn),
tensors moved by torch.distributed; start-up that never hangs on a failed worker. With
--nnodes, only this node's ranks are spawned here; the other nodes run headless.py."""

import dataclasses
import multiprocessing as mp
import socket
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from multiprocessing.connection import Connection, wait

from pagedllm.config import EngineConfig, ParallelConfig
from pagedllm.distributed.parallel_state import (
    destroy_distributed_environment,
    init_distributed_environment,
)
from pagedllm.executor.executor import DistributedExecutor
from pagedllm.executor.worker import (
    ERROR,
    JOINED,
    READY,
    distributed_backend,
    rank_device,
    worker_main,
)

WORKER_START_TIMEOUT_S = 300.0  # a healthy worker loading a large shard; failures show at once
_POLL_S = 0.05  # how often start-up checks whether rank 0's own rendezvous has finished
BOOTSTRAP_ADVICE = (
    'put the code that creates the LLM under `if __name__ == "__main__":`, since each '
    "tensor-parallel worker is a spawned process that re-imports the main module"
)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def rendezvous_address(parallel: ParallelConfig) -> str:
    """Where the ranks meet: rank 0's master_addr:master_port across nodes (vLLM's
    --master-addr/--master-port), a free loopback port on one."""
    if parallel.nnodes > 1:
        return f"tcp://{parallel.master_addr}:{parallel.master_port}"
    return f"tcp://127.0.0.1:{free_port()}"


class MultiprocExecutor(DistributedExecutor):
    """Rank 0 here, ranks 1..N-1 in spawned processes; tensors move by torch.distributed.

    Start-up never hangs on a worker that dies or raises: rank 0 joins the process group in
    a thread while it watches the workers' pipes and exit sentinels, loads its own shard,
    then waits for each worker's READY (its shard is loaded) the same way, and raises with
    the worker's traceback, or its exit code, as soon as one fails.
    """

    death_wait_s = 1.0

    def __init__(self, config: EngineConfig) -> None:
        _check_not_bootstrapping()
        parallel = config.parallel_config
        world_size, local_ranks = parallel.world_size, parallel.ranks_per_node
        pp = parallel.pipeline_parallel_size
        init_method = rendezvous_address(parallel)
        self.processes: list[mp.Process] = []
        self.conns: list[Connection] = []
        self._stage: dict[int, str] = {}  # rank -> the last start-up report it sent
        self._stopping = {"graceful": False}
        self._finalizer = weakref.finalize(self, _stop_workers, self.processes, self._stopping)
        try:
            deadline = time.monotonic() + WORKER_START_TIMEOUT_S
            self._spawn_workers(config, world_size, local_ranks, init_method)
            backend = distributed_backend(config.device)
            rendezvous = in_daemon_thread(
                lambda: init_distributed_environment(
                    world_size, 0, init_method, backend, pipeline_parallel_size=pp
                )
            )
            self._watch_workers(JOINED, rendezvous.done, deadline)
            rendezvous.result()
            device = rank_device(config.device, 0, local_ranks)
            super().__init__(dataclasses.replace(config, device=device))
            self._watch_workers(READY, lambda: not self._behind(READY), deadline)
        except BaseException:
            self.shutdown()
            raise

    def _spawn_workers(
        self, config: EngineConfig, world_size: int, local_ranks: int, init_method: str
    ) -> None:
        """Start ranks 1..local_ranks-1 (this node's; with --nnodes the other nodes' ranks are
        started by their headless processes), each with a pipe for its start-up reports. This
        process closes its copy of the child's end, so a worker's exit reads as EOF."""
        ctx = mp.get_context("spawn")
        for rank in range(1, local_ranks):
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

    def _worker_failure(self, error: BaseException) -> RuntimeError:
        """A collective failed: name the worker that died and show its traceback."""
        time.sleep(0.2)  # let a failing worker's report arrive
        for rank, (process, conn) in enumerate(zip(self.processes, self.conns), start=1):
            detail = _report(conn)
            if detail or not process.is_alive():
                why = detail or f"exit code {process.exitcode}"
                return RuntimeError(f"tensor-parallel worker {rank} died ({error}):\n{why}")
        return RuntimeError(f"tensor-parallel collective failed: {error}")

    def is_healthy(self) -> bool:
        return all(p.is_alive() for p in self.processes)

    def shutdown(self) -> None:
        """Tell the workers to stop if all are in the control loop, then wait for (or kill)
        them; a worker still starting cannot take the message. A second call does nothing."""
        if (
            self._finalizer.alive
            and not self._behind(READY)
            and self.is_healthy()
            and hasattr(self, "link")
        ):
            try:
                self._send_shutdown()
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


def in_daemon_thread(fn: Callable[[], None]) -> Future:
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
