"""RayExecutor (vLLM's "ray" distributed executor backend): rank 0 in this process (the
driver), ranks 1..N-1 of the tensor x pipeline parallel world as Ray actors placed by a
placement group (ray_utils.py), tensors moved by torch.distributed as under the
multiprocessing executor.

Each actor is started on its rank's bundle with its rank's environment (RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT: the driver node's IP and a free
port), joins the process group, loads its shard, then runs worker.run_worker_loop, the loop
every follower runs, as one long method call. Its ObjectRef is the actor's health: it
resolves only when the loop ends, with the actor's error if it raised or died, so start-up
and steps raise with that error instead of hanging.
"""

import dataclasses
import os
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch

from pagedllm.config import EngineConfig
from pagedllm.distributed.parallel_state import (
    destroy_distributed_environment,
    init_distributed_environment,
)
from pagedllm.executor.executor import DistributedExecutor
from pagedllm.executor.model_runner import ModelRunner
from pagedllm.executor.multiproc_executor import (
    WORKER_START_TIMEOUT_S,
    free_port,
    in_daemon_thread,
)
from pagedllm.executor.ray_utils import (
    bundle_nodes,
    connect_to_cluster,
    create_placement_group,
    driver_node,
    import_ray,
    local_ranks,
)
from pagedllm.executor.worker import distributed_backend, rank_device, run_worker_loop

_POLL_S = 0.05
DEATH_NOTICE_S = 10.0  # how long a failed collective waits for Ray to report the dead actor


class RayWorker:
    """One rank > 0, as a Ray actor; its methods run in the order the driver calls them."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.runner: ModelRunner | None = None

    def describe(self) -> tuple[int, list[int]]:
        """(pid, the GPU ids Ray gave this actor)."""
        import ray

        return os.getpid(), [int(i) for i in ray.get_gpu_ids()]

    def join(self) -> None:
        """Join the process group at MASTER_ADDR:MASTER_PORT on this rank's device."""
        cuda = torch.device(self.config.device).type == "cuda"
        local_rank = 0 if cuda else int(os.environ["LOCAL_RANK"])  # Ray shows one GPU
        device = rank_device(self.config.device, local_rank, int(os.environ["LOCAL_WORLD_SIZE"]))
        self.config = dataclasses.replace(self.config, device=device)
        world_size, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
        init_distributed_environment(
            world_size,
            rank,
            "env://",
            distributed_backend(device),
            pipeline_parallel_size=self.config.parallel_config.pipeline_parallel_size,
        )

    def load(self) -> None:
        self.runner = ModelRunner(self.config)

    def run(self) -> None:
        """Follow rank 0 until it says shutdown."""
        assert self.runner is not None, "load() was not called"
        try:
            run_worker_loop(self.runner)
        finally:
            destroy_distributed_environment()


class RayExecutor(DistributedExecutor):
    """Rank 0 here, ranks 1..N-1 as Ray actors on a placement group; see the module doc."""

    def __init__(self, config: EngineConfig) -> None:
        self.ray = import_ray()
        world_size = config.parallel_config.world_size
        self.actors: list[Any] = []
        self.loops: list[Any] = []  # each actor's run() call, pending while it follows
        self.worker_pids: list[int] = []
        self._loaded = False
        self._held: dict[str, Any] = {"group": None, "owns_ray": connect_to_cluster(world_size)}
        self._finalizer = weakref.finalize(self, _release, self.ray, self.actors, self._held)
        try:
            deadline = time.monotonic() + WORKER_START_TIMEOUT_S
            self._start(config, world_size, deadline)
        except BaseException:
            self.shutdown()
            raise

    def _start(self, config: EngineConfig, world_size: int, deadline: float) -> None:
        cuda = torch.device(config.device).type == "cuda"
        node_id, ip = driver_node()
        group = create_placement_group(world_size, "GPU" if cuda else "CPU", (node_id, ip))
        self._held["group"] = group
        nodes = bundle_nodes(group)
        local = local_ranks(nodes)
        port = free_port("0.0.0.0")
        self._create_actors(config, group, local, (ip, port), cuda)
        described = [actor.describe.remote() for actor in self.actors]
        self._watch(described, deadline)
        pids_and_gpus = self.ray.get(described)
        self.worker_pids = [pid for pid, _ in pids_and_gpus]
        gpus = [gpu for _, actor_gpus in pids_and_gpus for gpu in actor_gpus]
        joined = [actor.join.remote() for actor in self.actors]
        loaded = [actor.load.remote() for actor in self.actors]
        self.loops = [actor.run.remote() for actor in self.actors]
        backend = distributed_backend(config.device)
        pp = config.parallel_config.pipeline_parallel_size
        rendezvous = in_daemon_thread(
            lambda: init_distributed_environment(
                world_size, 0, f"tcp://{ip}:{port}", backend, pipeline_parallel_size=pp
            )
        )
        self._watch(joined, deadline, until=rendezvous.done)
        rendezvous.result()
        on_driver_node = [g for g, node in zip(gpus, nodes[1:]) if node == node_id]
        device = _driver_device(config.device, local[0][1], on_driver_node)
        super().__init__(dataclasses.replace(config, device=device))
        self._watch(loaded, deadline)
        self._loaded = True

    def _create_actors(
        self,
        config: EngineConfig,
        group: Any,
        local: list[tuple[int, int]],
        master: tuple[str, int],
        cuda: bool,
    ) -> None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        actor_class = self.ray.remote(RayWorker)
        for rank in range(1, len(local)):
            env = {
                "RANK": str(rank),
                "WORLD_SIZE": str(len(local)),
                "LOCAL_RANK": str(local[rank][0]),
                "LOCAL_WORLD_SIZE": str(local[rank][1]),
                "MASTER_ADDR": master[0],
                "MASTER_PORT": str(master[1]),
            }
            strategy = PlacementGroupSchedulingStrategy(
                placement_group=group,
                placement_group_bundle_index=rank,
                placement_group_capture_child_tasks=True,
            )
            actor = actor_class.options(
                num_cpus=0 if cuda else 1,
                num_gpus=1 if cuda else 0,
                scheduling_strategy=strategy,
                runtime_env={"env_vars": env},
            ).remote(config)
            self.actors.append(actor)

    def _watch(
        self, refs: list[Any], deadline: float, until: Callable[[], bool] | None = None
    ) -> None:
        """Poll until `until()` (default: every call in `refs` has returned); raise with an
        actor's error as soon as one of its calls fails."""
        while True:
            ready = self.ray.wait(refs, num_returns=len(refs), timeout=_POLL_S)[0] if refs else []
            for ref in ready:
                self._get(refs.index(ref) + 1, ref, "failed to start")
            if until() if until is not None else len(ready) == len(refs):
                return
            if not refs:
                time.sleep(_POLL_S)
            if time.monotonic() > deadline:
                behind = [i + 1 for i, ref in enumerate(refs) if ref not in ready]
                raise RuntimeError(
                    f"tensor-parallel workers {behind} did not start within "
                    f"{WORKER_START_TIMEOUT_S:.0f} s"
                )

    def _get(self, rank: int, ref: Any, what: str) -> None:
        try:
            self.ray.get(ref)
        except self.ray.exceptions.RayError as e:
            raise RuntimeError(f"tensor-parallel worker {rank} {what}:\n{e}") from None

    def _worker_failure(self, error: BaseException) -> RuntimeError:
        """A collective failed: wait for Ray to report the actor that died, and name it."""
        if self.loops:
            ready, _ = self.ray.wait(self.loops, num_returns=1, timeout=DEATH_NOTICE_S)
            for ref in ready:
                rank = self.loops.index(ref) + 1
                try:
                    self.ray.get(ref)
                except self.ray.exceptions.RayError as e:
                    return RuntimeError(f"tensor-parallel worker {rank} died ({error}):\n{e}")
        return RuntimeError(f"tensor-parallel collective failed: {error}")

    def is_healthy(self) -> bool:
        """Every actor is still in its loop."""
        if not self.loops:
            return True
        ready, _ = self.ray.wait(self.loops, num_returns=len(self.loops), timeout=0)
        return not ready

    def shutdown(self) -> None:
        """Tell the actors to stop if all follow rank 0, then kill them and free the
        placement group (and stop Ray if this executor started it)."""
        if self._loaded and self.is_healthy():
            try:
                self._send_shutdown()
                self.ray.wait(self.loops, num_returns=len(self.loops), timeout=5)
            except RuntimeError:
                pass
        self._loaded = False
        self._finalizer()


def _driver_device(device: str, ranks_on_node: int, gpus_of_node_actors: list[int]) -> str:
    """Rank 0's device: on CUDA the first GPU of this node that no actor of the group holds
    (Ray reserved one for bundle 0 there); on CPU its share of the cores."""
    if torch.device(device).type != "cuda":
        return rank_device(device, 0, ranks_on_node)
    visible = range(torch.cuda.device_count())
    free = [i for i in visible if i not in gpus_of_node_actors]
    if not free:
        raise RuntimeError("no GPU of this node is left for rank 0 beside the Ray actors'")
    return rank_device(device, free[0], ranks_on_node)


def _release(ray: Any, actors: list[Any], held: dict[str, Any]) -> None:
    """Kill the actors, remove the placement group, and stop Ray if the executor started
    it. Also runs when the executor is dropped, and at interpreter exit."""
    destroy_distributed_environment()
    if not ray.is_initialized():
        return
    for actor in actors:
        ray.kill(actor, no_restart=True)
    if held["group"] is not None:
        ray.util.remove_placement_group(held["group"])
    if held["owns_ray"]:
        ray.shutdown()
