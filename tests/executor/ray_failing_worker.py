"""A RayWorker whose shard never fits: test_ray_executor swaps it in to check that an actor
failing while it starts makes LLM(...) raise its error. A module of its own, importable from
the repository root, because Ray actors import their class by its module's name."""

from pagedllm.executor.ray_executor import RayWorker


class FailingWorker(RayWorker):
    def load(self) -> None:
        raise MemoryError("injected: the shard does not fit on this worker")
