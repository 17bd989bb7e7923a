"""vLLM's multi-node flags over the multiprocessing executor (pagedllm/executor/headless.py,
`pagedllm serve --headless`): two `pagedllm serve` processes on loopback, node 0 serving and
node 1 headless, form one TP=2 world. Reference: the same greedy completion from one rank."""

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import openai
import pytest

from pagedllm import LLM, SamplingParams
from pagedllm.config import ModelConfig
from pagedllm.engine.arg_utils import EngineArgs
from pagedllm.engine.tokenizer import get_tokenizer
from pagedllm.entrypoints.openai import api_server
from pagedllm.executor.headless import run_headless
from tests.entrypoints.openai.remote_server import free_port, remote_server
from tests.processes import MARKER_VARIABLE, marked_processes

PROMPT = list(range(3, 20))


@pytest.fixture
def model_folder(tiny_model_path, tmp_path: Path) -> str:
    """A tiny checkpoint with the default model's tokenizer, as the server needs one."""
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_path("llama-gqa4"), folder)
    get_tokenizer(ModelConfig.create(None, "auto", None, "cpu")).save_pretrained(folder)
    return str(folder)


def test_two_nodes_on_loopback_serve_one_tp2_model(model_folder: str) -> None:
    """Node 1 (--headless) starts rank 1, node 0 serves with rank 0; they meet at
    127.0.0.1:--master-port. Stopping node 0 shuts node 1's rank down and it exits 0."""
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    one = LLM(model_folder, num_kv_blocks=512, max_model_len=128, dtype="float32")
    (expected,) = one.generate([{"prompt_token_ids": PROMPT}], params, use_tqdm=False)
    one.close()
    nodes = ["--tensor-parallel-size", "2", "--nnodes", "2", "--master-port", str(free_port())]
    engine = ["--num-kv-blocks", "512", "--max-model-len", "128", "--dtype", "float32"]
    marker = f"headless-{os.getpid()}"
    cores = sorted(os.sched_getaffinity(0))
    node1 = subprocess.Popen(
        [sys.executable, "-m", "pagedllm.entrypoints.openai.api_server", model_folder]
        + [*nodes, *engine, "--node-rank", "1", "--headless"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2]), MARKER_VARIABLE: marker},
        preexec_fn=lambda: os.sched_setaffinity(0, cores[len(cores) // 2 :]),
    )
    try:
        with (
            own_cores(cores[: len(cores) // 2] or cores),
            remote_server(*nodes, "--max-model-len", "128", model=model_folder) as server,
        ):
            client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
            completion = client.completions.create(
                model=model_folder, prompt=PROMPT, max_tokens=8, temperature=0
            )
            assert completion.choices[0].text == expected.outputs[0].text
        log = node1.communicate(timeout=30)[0]
        assert node1.returncode == 0, log
        assert "node 1 of 2: ranks 1..1 follow rank 0 at 127.0.0.1" in log
    finally:
        if node1.poll() is None:
            node1.send_signal(signal.SIGKILL)
            node1.wait()
    assert marked_processes(marker) == []


@contextmanager
def own_cores(cores: list[int]) -> Iterator[None]:
    """Processes started inside run on `cores`: each "node" gets its own half of this
    machine's cores, as it would get its own machine (each rank takes all its node's cores,
    and two nodes' threads on the same cores spin in each other's way)."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def test_node_rank_flags_are_checked(model_folder: str, capsys) -> None:
    """A node past the first serves nothing, so it must say --headless; node 0 cannot be
    headless; the world must split evenly over the nodes."""
    base = [model_folder, "--tensor-parallel-size", "2", "--nnodes", "2"]
    for flags, error in [
        (["--node-rank", "1"], "--node-rank 1 runs no API server (node 0 serves): add --headless"),
        (["--headless"], "a headless node runs the ranks of node_rank > 0"),
        (["--nnodes", "3", "--node-rank", "1", "--headless"], "do not split evenly"),
        (["--node-rank", "2"], "node_rank 2 is outside [0, nnodes=2)"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            api_server.main([*base, *flags])
        assert exit_info.value.code == 2
        assert error in capsys.readouterr().err


def test_offline_node_past_the_first_runs_headless(monkeypatch, model_folder: str) -> None:
    """LLM(..., node_rank=1) on a node past the first starts that node's ranks instead of an
    engine, and exits with their status, as torchrun's ranks > 0 do."""
    calls = []

    def run_headless_stub(config) -> None:
        calls.append(config)
        raise SystemExit(0)

    monkeypatch.setattr("pagedllm.engine.llm_engine.run_headless", run_headless_stub)
    with pytest.raises(SystemExit):
        LLM(model_folder, tensor_parallel_size=2, nnodes=2, node_rank=1, master_port=1)
    assert [c.parallel_config.node_rank for c in calls] == [1]
    with pytest.raises(ValueError, match="node_rank > 0"):
        run_headless(EngineArgs(model_folder, tensor_parallel_size=2).create_engine_config())
