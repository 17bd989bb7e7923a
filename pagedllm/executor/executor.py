"""Executors run the model for the engine: in-process (tp = 1), or across tensor-parallel
processes (tp > 1): spawned by MultiprocExecutor (multiproc_executor.py), placed as Ray actors
by RayExecutor (ray_executor.py) or launched by torchrun (torchrun_executor.py); make_executor
picks (factory.py)."""

from pagedllm.config import EngineConfig
from pagedllm.distributed.parallel_state import destroy_distributed_environment
from pagedllm.executor.model_runner import ModelRunner, StepInput, StepOutput
from pagedllm.executor.worker import (
    EXECUTE,
    INIT_KV_CACHE,
    SHUTDOWN,
    broadcast_message,
    shutdown_barrier,
)
from pagedllm.sample.metadata import SamplingRow
from pagedllm.sampling_params import SamplingParams


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
    """Rank 0 of a tensor-parallel world: each call is broadcast, then run here too. A
    failed collective is reported through `_worker_failure`, which an executor that can see
    its workers overrides to name the one that died."""

    def _call(self, method: str, argument: object) -> None:
        try:
            broadcast_message((method, argument))
        except RuntimeError as e:
            raise self._worker_failure(e) from e

    def init_kv_cache(self, num_blocks: int) -> None:
        self._call(INIT_KV_CACHE, num_blocks)
        super().init_kv_cache(num_blocks)

    def execute(self, step: StepInput, rows: list[SamplingRow]) -> StepOutput:
        self._call(EXECUTE, step)
        try:
            return super().execute(step, rows)
        except RuntimeError as e:
            if self.is_healthy():
                raise
            raise self._worker_failure(e) from e

    def _worker_failure(self, error: BaseException) -> RuntimeError:
        return RuntimeError(f"tensor-parallel collective failed: {error}")

    def shutdown(self) -> None:
        """Stop the other ranks (see broadcast_shutdown); a second call does nothing."""
        if getattr(self, "_shut_down", False):
            return
        self._shut_down = True
        try:
            self._call(SHUTDOWN, None)
            shutdown_barrier()
        finally:
            destroy_distributed_environment()
