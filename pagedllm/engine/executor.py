"""Executors run the model for the engine: in-process (tp = 1) or across tensor-parallel
processes (tp > 1), spawned here or launched by torchrun (env:// variables)."""

import dataclasses
import multiprocessing as mp
import os
import socket
import time
import weakref
from multiprocessing.connection import Connection

from pagedllm.config import EngineConfig
from pagedllm.distributed.parallel_state import (
    destroy_distributed_environment,
    init_distributed_environment,
)
from pagedllm.engine.model_runner import ModelRunner, StepInput, StepOutput
from pagedllm.engine.worker import (
    EXECUTE,
    INIT_KV_CACHE,
    READY,
    SHUTDOWN,
    broadcast_message,
    distributed_backend,
    rank_device,
    run_worker_loop,
    worker_main,
)
from pagedllm.sample.metadata import SamplingRow

WORKER_START_TIMEOUT_S = 300.0


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
    """Rank 0 here, ranks 1..N-1 in spawned processes; tensors move by torch.distributed."""

    def __init__(self, config: EngineConfig) -> None:
        world_size = config.parallel_config.tensor_parallel_size
        init_method = f"tcp://127.0.0.1:{_free_port()}"
        ctx = mp.get_context("spawn")
        self.processes: list[mp.Process] = []
        self.conns: list[Connection] = []
        for rank in range(1, world_size):
            parent_conn, child_conn = ctx.Pipe(duplex=False)
            process = ctx.Process(
                target=worker_main,
                args=(config, rank, world_size, init_method, child_conn),
                name=f"pagedllm-tp-worker-{rank}",
                daemon=True,
            )
            process.start()
            self.processes.append(process)
            self.conns.append(parent_conn)
        self._stopping = {"graceful": False}
        self._finalizer = weakref.finalize(self, _stop_workers, self.processes, self._stopping)
        try:
            init_distributed_environment(
                world_size, 0, init_method, distributed_backend(config.device)
            )
            self._wait_ready()
            device = rank_device(config.device, 0, world_size)
            config = dataclasses.replace(config, device=device)
            super().__init__(config)
        except BaseException:
            self.shutdown()
            raise

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + WORKER_START_TIMEOUT_S
        for rank, conn in enumerate(self.conns, start=1):
            if not conn.poll(max(0.0, deadline - time.monotonic())):
                raise RuntimeError(f"tensor-parallel worker {rank} did not start in time")
            kind, detail = conn.recv()
            if kind != READY:
                raise RuntimeError(f"tensor-parallel worker {rank} failed:\n{detail}")

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
            if all(p.is_alive() for p in self.processes):
                raise
            raise self._worker_failure(e) from e

    def shutdown(self) -> None:
        """Tell live workers to stop, then wait for (or kill) them."""
        if self.processes and all(p.is_alive() for p in self.processes):
            try:
                broadcast_message((SHUTDOWN, None))
                self._stopping["graceful"] = True
            except RuntimeError:
                pass
        self._finalizer()


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
        run_worker_loop(dataclasses.replace(config, device=_torchrun_device(config)))
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
