"""Executors run the model for the engine: in-process (one rank), or across tensor- and
pipeline-parallel processes: spawned by MultiprocExecutor (multiproc_executor.py), placed as
Ray actors by RayExecutor (ray_executor.py) or launched by torchrun (torchrun_executor.py);
make_executor picks (factory.py).

`execute_async` submits a step and returns a StepFuture; with pipeline parallelism up to
`max_concurrent_batches` (one per stage) are in flight at once, so every stage works on
a micro-batch at every step (vLLM v1's batch queue). Futures resolve in submission order.
Under async scheduling (no pipeline parallelism) two are: the step launched on the device
without waiting, and the one the engine schedules meanwhile.
"""

import functools
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from pagedllm.config import EngineConfig
from pagedllm.distributed.parallel_state import destroy_distributed_environment
from pagedllm.executor.model_runner import ForwardOutput, ModelRunner, StepInput, StepOutput
from pagedllm.executor.row_deltas import RowDeltaSender
from pagedllm.executor.stage_link import StageLink
from pagedllm.executor.table_deltas import BlockTableSender
from pagedllm.executor.worker import (
    EXECUTE,
    INIT_KV_CACHE,
    KV_CACHE_BYTES,
    PROFILE_RUN,
    SHUTDOWN,
    shutdown_barrier,
)
from pagedllm.sample.metadata import SamplingRow
from pagedllm.sampling_params import SamplingParams


class StepFuture:
    """A submitted step's output: ready now, or received when first asked for."""

    def __init__(self, receive: Callable[[], StepOutput]) -> None:
        self._receive: Callable[[], StepOutput] | None = receive
        self._output: StepOutput | None = None

    @classmethod
    def ready(cls, output: StepOutput) -> "StepFuture":
        future = cls(lambda: output)
        future.result()
        return future

    def done(self) -> bool:
        return self._receive is None

    def result(self) -> StepOutput:
        if self._receive is not None:
            self._output, self._receive = self._receive(), None
        return self._output


class Executor:
    """One rank: the model runs in this process."""

    def __init__(self, config: EngineConfig) -> None:
        self.runner = ModelRunner(config)
        self.async_scheduling = config.scheduler_config.async_scheduling
        self.max_concurrent_batches = 2 if self.async_scheduling else 1

    @property
    def kv_cache_bytes_per_token(self) -> int:
        return self.runner.kv_cache_bytes_per_token

    def init_kv_cache(self, num_blocks: int) -> None:
        self.runner.init_kv_cache(num_blocks)

    def available_kv_cache_bytes(self) -> int:
        """What gpu_memory_utilization leaves the KV cache, from a profile run (a GPU's)."""
        return self.runner.available_kv_cache_bytes()

    def execute(self, step: StepInput, rows: list[SamplingRow]) -> StepOutput:
        return self.runner.execute(step, rows)

    def execute_async(self, step: StepInput, rows: list[SamplingRow]) -> StepFuture:
        """Under async scheduling the step is launched and its future waits for it when
        asked (on the CPU, where the step has run by then, too: the engine then runs the
        same schedule as on a GPU)."""
        if self.async_scheduling:
            return StepFuture(self.runner.launch(step, rows))
        return StepFuture.ready(self.execute(step, rows))

    def launch_forward(self, step: StepInput) -> ForwardOutput:
        """Async scheduling, for a step whose rows need the step in flight's tokens on the
        host: its forward now, its sampling (`launch_sampling`) once they are there."""
        return self.runner.launch_forward(step)

    def launch_sampling(
        self, step: StepInput, forward: ForwardOutput, rows: list[SamplingRow]
    ) -> StepFuture:
        """The sampling of a forward `launch_forward` launched, from rows built after the
        step before was processed (their output lists hold its tokens)."""
        return StepFuture(
            self.runner.launch_sampling(step, forward, rows, rows_lack_placeholders=False)
        )

    def validate_params(self, params: SamplingParams) -> None:
        """The logits processors' own checks of a request (they run on rank 0 only)."""
        self.runner.sampler.logitsprocs.validate_params(params)

    def is_healthy(self) -> bool:
        """Whether the executor can run another step after one failed: a single process
        has no part that can die on its own."""
        return True

    def shutdown(self) -> None:
        """Nothing to stop in one process."""


class DistributedExecutor(Executor):
    """Rank 0 of a parallel world: the first stage's tensor-parallel rank 0. Each call is
    sent to every rank (stage_link.py), then run here too. Under pipeline parallelism the
    last stage samples, from the rows it keeps: each step sends it only what changed
    (row_deltas.py). A failed collective is reported through `_worker_failure`, which an
    executor that can see its workers overrides to name the one that died."""

    # A dead peer's sockets close a moment before its process shows as dead: how long a
    # failure waits for is_healthy() to turn false before it is raised as it is.
    death_wait_s = 0.0

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        self.link = StageLink(self.runner.device)
        if not self.async_scheduling:
            self.max_concurrent_batches = config.parallel_config.pipeline_parallel_size
        self.row_sender = RowDeltaSender()
        self.table_sender = BlockTableSender()

    def _call(self, method: str, argument: object) -> None:
        try:
            self.link.send_message((method, argument))
        except RuntimeError as e:
            raise self._worker_failure(e) from e

    @functools.cached_property
    def kv_cache_bytes_per_token(self) -> int:
        """The most of any rank's (a stage holding more layers): its cache decides how
        many blocks every rank's cache holds. Asked of every rank once."""
        self._call(KV_CACHE_BYTES, None)
        with self._failures():
            return self.link.max_over_ranks(super().kv_cache_bytes_per_token)

    def init_kv_cache(self, num_blocks: int) -> None:
        self._call(INIT_KV_CACHE, num_blocks)
        super().init_kv_cache(num_blocks)

    def available_kv_cache_bytes(self) -> int:
        """The least of any rank's: every rank runs the profile step (its collectives
        need all of them), and every rank's cache holds the same blocks."""
        self._call(PROFILE_RUN, None)
        with self._failures():
            return -self.link.max_over_ranks(-super().available_kv_cache_bytes())

    def execute(self, step: StepInput, rows: list[SamplingRow]) -> StepOutput:
        return self.execute_async(step, rows).result()

    def execute_async(self, step: StepInput, rows: list[SamplingRow]) -> StepFuture:
        sent = self.table_sender.encode(step)
        if self.link.samples:  # no pipeline: this rank samples
            self._call(EXECUTE, (sent, None))
            with self._failures():
                wait = self.runner.launch(step, rows)
            if not self.async_scheduling:
                return StepFuture.ready(self._wait_for(wait))
            return StepFuture(lambda: self._wait_for(wait))
        self._call(EXECUTE, (sent, self.row_sender.deltas(rows, step.finished_req_ids)))
        with self._failures():
            self.link.send_intermediate(self.runner.forward_stage(step, None))
        return StepFuture(self._receive_output)

    def launch_forward(self, step: StepInput) -> ForwardOutput:
        assert self.link.samples, "async scheduling runs without pipeline parallelism"
        self._call(EXECUTE, (self.table_sender.encode(step), None))
        with self._failures():
            return self.runner.launch_forward(step)

    def launch_sampling(
        self, step: StepInput, forward: ForwardOutput, rows: list[SamplingRow]
    ) -> StepFuture:
        with self._failures():
            wait = self.runner.launch_sampling(step, forward, rows, rows_lack_placeholders=False)
        return StepFuture(lambda: self._wait_for(wait))

    def _wait_for(self, wait: Callable[[], StepOutput]) -> StepOutput:
        with self._failures():
            return wait()

    def _receive_output(self) -> StepOutput:
        with self._failures():
            return self.link.recv_output()

    @contextmanager
    def _failures(self) -> Iterator[None]:
        """A RuntimeError raised while a worker is dead is that worker's failure."""
        try:
            yield
        except RuntimeError as e:
            deadline = time.monotonic() + self.death_wait_s
            while self.is_healthy() and time.monotonic() < deadline:
                time.sleep(0.05)
            if self.is_healthy():
                raise
            raise self._worker_failure(e) from e

    def _worker_failure(self, error: BaseException) -> RuntimeError:
        return RuntimeError(f"collective with another rank failed: {error}")

    def _send_shutdown(self) -> None:
        """Tell every rank to stop, then wait in a barrier until all have heard it, so
        that closing the process group cannot cut the message off on its way to another
        node."""
        self._call(SHUTDOWN, None)
        self.link.pending.wait()
        shutdown_barrier()

    def shutdown(self) -> None:
        """Stop the other ranks (see _send_shutdown); a second call does nothing."""
        if getattr(self, "_shut_down", False):
            return
        self._shut_down = True
        try:
            self._send_shutdown()
        finally:
            destroy_distributed_environment()
