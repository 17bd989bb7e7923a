"""scripts/gpu_check.sh: without a GPU it stops at once with status 2 and says why; the
bench commands it runs (random weights of a shape read from a folder with only config.json,
--profile) run here on the CPU, on the tiny model's shape, with its flags."""

import json
import os
import subprocess
import sys
from collections.abc import Callable

import pytest
import torch

from tests.benchmarks.conftest import TINY_ENGINE_FLAGS, TINY_MODEL

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "gpu_check.sh")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without a GPU")
def test_the_script_fails_fast_without_a_gpu(tmp_path: object) -> None:
    env = {**os.environ, "PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", SCRIPT, str(tmp_path)], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "gpu_check: no GPU here" in done.stderr and "finds no CUDA GPU" in done.stderr


@pytest.fixture
def shape_only(tiny_model_path: Callable[[str], str], tmp_path: object) -> str:
    """A folder with the tiny model's config.json and no weights."""
    folder = f"{tmp_path}/shape"
    os.makedirs(folder)
    with open(f"{tiny_model_path(TINY_MODEL)}/config.json") as f:
        config = f.read()
    with open(f"{folder}/config.json", "w") as f:
        f.write(config)
    return folder


# The script's flags, but the device and the sizes.
RANDOM_BF16 = ["--load-format", "dummy", "--quantization", "none", "--dtype", "bfloat16"]
RANDOM_BF16 += ["--device", "cpu", "--profile", *TINY_ENGINE_FLAGS]


def test_latency_on_random_weights_with_a_profile(
    run_bench: Callable[[list[str]], str], shape_only: str, tmp_path: object
) -> None:
    argv = ["latency", "--model", shape_only, *RANDOM_BF16, "--max-num-seqs", "8"]
    argv += ["--input-len", "4", "--output-len", "3", "--num-iters", "1", "--num-warmup", "0"]
    out = run_bench([*argv, "--bandwidth-mb", "1", "--json", f"{tmp_path}/l.json"])
    profile = json.load(open(f"{tmp_path}/l.json"))["results"]["pagedllm"]["profile"]
    assert profile["device"] == "cpu" and profile["ops"] and profile["wall_us"] > 0
    assert sum(op["share"] for op in profile["ops"]) <= 1 + 1e-9
    assert "profile (cpu self time)" in out


def test_throughput_against_transformers_on_random_weights(
    run_bench: Callable[[list[str]], str], shape_only: str, tmp_path: object
) -> None:
    argv = ["throughput", "--model", shape_only, *RANDOM_BF16, "--backend", "pagedllm,hf"]
    argv += ["--num-prompts", "3", "--input-len", "4", "--output-len", "2:3"]
    run_bench([*argv, "--hf-batch-size", "2", "--json", f"{tmp_path}/t.json"])
    report = json.load(open(f"{tmp_path}/t.json"))
    assert (
        report["results"]["pagedllm"]["output_tokens"] == report["results"]["hf"]["output_tokens"]
    )
    assert report["results"]["pagedllm"]["profile"]["ops"]
    assert "pagedllm" not in report["ratios"] and report["ratios"]["hf"]
