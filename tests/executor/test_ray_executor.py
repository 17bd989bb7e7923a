"""RayExecutor (pagedllm/executor/ray_executor.py) on a two-node Ray cluster that the module
starts on loopback (`ray start --head`, then `ray start --address`, one CPU and a distinct
custom resource each), so the placement group must put the two ranks on different nodes.
Reference: the multiprocessing executor's tokens and logprobs on the same tiny checkpoint
(tensor parallel), one rank's (pipeline parallel)."""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pagedllm import LLM, SamplingParams
from pagedllm.executor import ray_executor
from tests.executor.parallel_jobs import assert_same, mixed_prompts
from tests.executor.ray_failing_worker import FailingWorker
from tests.processes import MARKER_VARIABLE, gone, marked_processes, stop_marked

ray = pytest.importorskip("ray")

ENGINE = dict(skip_tokenizer_init=True, num_kv_blocks=256, block_size=4, dtype="float32")
PARAMS = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=2)
PROMPTS = [{"prompt_token_ids": list(range(3, 3 + n))} for n in (5, 17)]
RAY_CLI = str(Path(sys.executable).with_name("ray"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ray_start(*flags: str, env: dict[str, str]) -> None:
    common = ["--node-ip-address", "127.0.0.1", "--num-cpus", "1", "--disable-usage-stats"]
    common += ["--dashboard-agent-listen-port", "0"]
    command = [RAY_CLI, "start", *common, *flags]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"{' '.join(command)}:\n{result.stdout}\n{result.stderr}"


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """Two Ray nodes on 127.0.0.1 (resources node_a and node_b); yields the GCS address.
    The cluster has its own temp dir, so it neither finds nor disturbs another one, and its
    processes carry a marker, so the module stops exactly them (never `ray stop`, which
    stops every Ray process of the machine)."""
    temp_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # short: Ray's socket paths
    address, marker = f"127.0.0.1:{free_port()}", f"ray-{os.getpid()}-{time.monotonic_ns()}"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2]), MARKER_VARIABLE: marker}
    env["RAY_AUTH_MODE"] = "disabled"  # a token in ~/.ray (from another cluster) is not ours
    env.pop("RAY_ADDRESS", None)
    head = ["--head", "--port", address.split(":")[1], "--temp-dir", temp_dir]
    try:
        ray_start(*head, "--include-dashboard", "false", "--resources", '{"node_a": 1}', env=env)
        ray_start("--address", address, "--resources", '{"node_b": 1}', env=env)
        yield address
    finally:
        if ray.is_initialized():
            ray.shutdown()
        stop_marked(marker)
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert marked_processes(marker, grace_s=0) == []


@pytest.fixture
def on_cluster(cluster: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("RAY_ADDRESS", cluster)
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    return cluster


def test_tp2_on_two_nodes_matches_multiprocessing(on_cluster, tiny_model_path) -> None:
    """The Ray run with async scheduling (its actors get each step's sampled ids by a
    broadcast), the multiprocessing one without."""
    path = tiny_model_path("llama-gqa4")
    with LLM(path, tensor_parallel_size=2, **ENGINE) as mp_llm:
        expected = mp_llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    ray_engine = dict(distributed_executor_backend="ray", async_scheduling=True, **ENGINE)
    with LLM(path, tensor_parallel_size=2, **ray_engine) as llm:
        executor = llm.llm_engine.executor
        nodes = ray.util.placement_group_table(executor._held["group"])["bundles_to_node_id"]
        assert len(set(nodes.values())) == 2  # one CPU per node: the ranks are on both
        got = llm.generate(PROMPTS, PARAMS, use_tqdm=False)
        pids = executor.worker_pids
    for want, have in zip(expected, got, strict=True):
        a, b = want.outputs[0], have.outputs[0]
        assert a.token_ids == b.token_ids
        for lp_a, lp_b, token in zip(a.logprobs, b.logprobs, a.token_ids, strict=True):
            assert abs(lp_a[token].logprob - lp_b[token].logprob) <= 1e-5
    assert gone(pids)
    assert ray.util.placement_group_table()  # the group was removed: none left in use
    assert all(g["state"] == "REMOVED" for g in ray.util.placement_group_table().values())


def test_pp2_on_two_nodes_matches_one_rank(on_cluster, tiny_model_path) -> None:
    """A stage per node: the actor runs the pipeline's worker loop (StageLink), rank 0 gets
    the last stage's tokens back; pipeline parallelism alone is bit for bit one rank's."""
    path = tiny_model_path("llama-gqa4")
    engine = {**ENGINE, "max_num_batched_tokens": 16}  # several micro-batches in flight
    with LLM(path, **engine) as one:
        expected = one.generate(mixed_prompts(), PARAMS, use_tqdm=False)
    with LLM(path, pipeline_parallel_size=2, distributed_executor_backend="ray", **engine) as llm:
        executor = llm.llm_engine.executor
        nodes = ray.util.placement_group_table(executor._held["group"])["bundles_to_node_id"]
        assert len(nodes) == 2 and len(set(nodes.values())) == 2
        assert executor.max_concurrent_batches == 2
        got = llm.generate(mixed_prompts(), PARAMS, use_tqdm=False)
        pids = executor.worker_pids
    assert_same(expected, got, 0.0)
    assert gone(pids)


def test_killed_actor_raises_within_30s_and_leaves_no_process(on_cluster, tiny_model_path):
    llm = LLM(
        tiny_model_path("llama-gqa4"),
        tensor_parallel_size=2,
        distributed_executor_backend="ray",
        **ENGINE,
    )
    executor = llm.llm_engine.executor
    pids = executor.worker_pids
    assert executor.is_healthy()
    ray.kill(executor.actors[0])
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="tensor-parallel worker 1"):
        llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    assert time.monotonic() - start < 30
    assert not executor.is_healthy()
    llm.close()
    assert gone(pids)


def test_cluster_without_enough_devices_is_refused(on_cluster, tiny_model_path) -> None:
    """Two CPUs in the cluster, three ranks: a clear error before anything starts (the
    model's shape is one that splits over 3 ranks; it is never built)."""
    with pytest.raises(ValueError, match="has 2 CPU, but 3 ranks need one each"):
        LLM(
            tiny_model_path("llama-tied-mqa"),
            tensor_parallel_size=3,
            distributed_executor_backend="ray",
            hf_overrides={"num_attention_heads": 3},
            **ENGINE,
        )


def test_actor_failing_to_load_its_shard_raises_its_error(on_cluster, tiny_model_path, monkeypatch):
    """Rank 1's load() raises: LLM(...) raises the actor's traceback at once, not after the
    start-up deadline, and the actor does not outlive it."""
    monkeypatch.setattr(ray_executor, "RayWorker", FailingWorker)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="tensor-parallel worker 1 failed to start") as error:
        LLM(
            tiny_model_path("llama-gqa4"),
            tensor_parallel_size=2,
            distributed_executor_backend="ray",
            **ENGINE,
        )
    assert "MemoryError: injected: the shard does not fit on this worker" in str(error.value)
    assert time.monotonic() - start < 30
    assert gone(processes_named("ray::FailingWorker"))


def processes_named(prefix: str) -> list[int]:
    """Live processes whose command line starts with `prefix` (Ray names its actors' worker
    processes ray::<class>)."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if cmdline.read_bytes().startswith(prefix.encode()):
                pids.append(int(cmdline.parent.name))
        except OSError:
            continue
    return pids
