"""Tensor and pipeline parallelism launched by torchrun
(pagedllm/executor/torchrun_executor.py). Reference: torchrun's env:// variables (WORLD_SIZE,
RANK, LOCAL_RANK, LOCAL_WORLD_SIZE), and the greedy tokens of the same model in one
process."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from pagedllm import LLM, SamplingParams
from pagedllm.executor import torchrun_executor
from pagedllm.executor.torchrun_executor import torchrun_rank


@pytest.mark.parametrize(
    "env, rank",
    [
        ({}, None),
        ({"WORLD_SIZE": "1", "RANK": "0"}, None),  # one rank: no tensor parallelism
        ({"WORLD_SIZE": "2"}, None),  # not launched by torchrun: no RANK
        ({"WORLD_SIZE": "2", "RANK": "0"}, 0),
        ({"WORLD_SIZE": "4", "RANK": "3"}, 3),
    ],
)
def test_torchrun_rank(env: dict[str, str], rank: int | None, monkeypatch) -> None:
    for name in ("WORLD_SIZE", "RANK"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert torchrun_rank() == rank


@pytest.mark.parametrize("local_world_size, threads", [(None, 8), ("2", 4), ("16", 1)])
def test_cpu_ranks_on_a_host_share_its_cores(local_world_size, threads, monkeypatch) -> None:
    """8 cores over LOCAL_WORLD_SIZE ranks (1 if unset), at least 1 thread each."""
    calls = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.setenv("LOCAL_RANK", "1")
    if local_world_size is None:
        monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", local_world_size)
    config = SimpleNamespace(device="cpu")
    assert torchrun_executor._torchrun_device(config) == "cpu"
    assert calls == [threads]


@pytest.mark.parametrize("tp, pp", [(2, 1), (1, 2)])
def test_torchrun_launch_matches_single_process(tp: int, pp: int, tiny_model_path) -> None:
    """`torchrun --nproc-per-node 2 script.py`: ranks join through the env:// variables, as
    two tensor-parallel ranks or two pipeline stages."""
    path, prompt = tiny_model_path("llama-gqa4"), list(range(3, 20))
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    single = LLM(path, skip_tokenizer_init=True, num_kv_blocks=256, dtype="float32")
    expected = single.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
    script = Path(__file__).with_name("torchrun_generate.py")
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun), "--nproc-per-node", "2", "--master-port", str(free_port())]
    result = subprocess.run(
        [*cmd, str(script), path, json.dumps(prompt), str(tp), str(pp)],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("TOKENS")]
    assert lines == [f"TOKENS {json.dumps(expected[0].outputs[0].token_ids)}"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
