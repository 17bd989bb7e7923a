"""pagedllm/benchmarks/vllm_backend.py and vllm_driver.py: the vLLM peer's accounting, run
through the real driver against a fake `vllm` package (tests/benchmarks/fake_vllm: every request
gets exactly its max_tokens) with this interpreter as "vLLM's python"; reference: the token
counts of the seeded requests and latency_sample's formulas; and the error paths."""

import ast
import json
import os
import re
import sys
from collections.abc import Callable

import pytest

import pagedllm.benchmarks.vllm_driver as vllm_driver
from pagedllm.benchmarks.datasets import BenchRequest, random_requests
from pagedllm.benchmarks.metrics import latency_sample
from pagedllm.benchmarks.vllm_backend import VllmPeer, latency_samples, throughput_result
from pagedllm.config import ModelConfig
from tests.benchmarks.conftest import TINY_MODEL

FAKE_VLLM = os.path.join(os.path.dirname(__file__), "fake_vllm")
PEER = VllmPeer(sys.executable, 4, "auto", 0)


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> Callable[[], dict]:
    """Puts the fake vllm on the driver's path; returns a reader of what its LLM(...) got."""
    record = f"{tmp_path}/record.json"
    monkeypatch.setenv("PYTHONPATH", FAKE_VLLM)
    monkeypatch.setenv("FAKE_VLLM_RECORD", record)
    for name in [k for k in os.environ if k.startswith("VLLM_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_CACHE_HOME", f"{tmp_path}/cache")
    return lambda: json.load(open(record))


def test_driver_imports_only_vllm_and_the_stdlib() -> None:
    """It runs in vLLM's virtualenv, where pagedllm (and numpy, torch, ...) may be missing."""
    tree = ast.parse(open(vllm_driver.__file__).read())
    modules = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    modules |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    tops = {m.split(".")[0] for m in modules}
    assert tops - set(sys.stdlib_module_names) == {"vllm"}


def test_throughput_counts_what_vllm_returned(
    run_bench: Callable[[list[str]], str],
    tiny_model_path: Callable[[str], str],
    fake_vllm: Callable[[], dict],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: object,
) -> None:
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0")  # passes through
    json_path = f"{tmp_path}/throughput.json"
    model = tiny_model_path(TINY_MODEL)
    argv = ["throughput", "--model", model, "--backend", "vllm"]
    argv += ["--num-prompts", "5", "--input-len", "4:24", "--output-len", "2:7", "--seed", "3"]
    argv += ["--vllm-python", sys.executable, "--vllm-kv-cache-gib", "2", "--dtype", "fp32"]
    out = run_bench([*argv, "--json", json_path])

    requests = random_requests(5, (4, 24), (2, 7), vocab_size=320, seed=3)
    report = json.load(open(json_path))
    result = report["results"]["vllm"]
    input_tokens = sum(r.prompt_len for r in requests)
    output_tokens = sum(r.output_len for r in requests)
    assert (result["input_tokens"], result["output_tokens"]) == (input_tokens, output_tokens)
    assert result["startup_s"] > 0 and result["elapsed_s"] > 0
    row = out.splitlines()[2].split()  # backend, 3 rates, input tokens, output tokens, ...
    assert row[0] == "vllm" and list(map(int, row[4:6])) == [input_tokens, output_tokens]
    detail = "vLLM 0.0.fake in float32 (--dtype float32), VLLM_CPU_KVCACHE_SPACE=2 "
    detail += f"VLLM_CPU_OMP_THREADS_BIND=0, python {sys.executable}"
    assert result["detail"] == detail
    assert f"vllm: {detail}" in out
    assert fake_vllm() == {
        "model": model,
        "dtype": "float32",
        "max_model_len": ModelConfig.create(model).max_model_len,
        "seed": 3,
        "kv_cache_space": "2",
    }


def test_latency_on_a_gguf_runs_its_hf_folder(
    run_bench: Callable[[list[str]], str],
    tiny_gguf_path: str,
    fake_vllm: Callable[[], dict],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: object,
) -> None:
    """vLLM gets the GGUF's HF folder, its own 'auto' dtype and $VLLM_CPU_KVCACHE_SPACE."""
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "3")
    json_path = f"{tmp_path}/latency.json"
    argv = ["latency", "--model", tiny_gguf_path, "--backend", "vllm"]
    argv += ["--vllm-python", sys.executable, "--batch-size", "2", "--input-len", "8"]
    argv += ["--output-len", "4", "--num-iters", "3", "--bandwidth-mb", "8"]
    out = run_bench([*argv, "--json", json_path])

    result = json.load(open(json_path))["results"]["vllm"]
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        assert 0 < result[key]["p50"] <= result[key]["p90"] <= result[key]["p99"]
    assert result["tpot_s"]["mean"] >= 0.002  # the fake's step time
    assert result["decode_tokens_per_s"] == pytest.approx(2 / result["tpot_s"]["mean"])
    assert "vLLM 0.0.fake in bfloat16 (--dtype auto), VLLM_CPU_KVCACHE_SPACE=3," in result["detail"]
    assert result["detail"] in out
    record = fake_vllm()
    assert record["model"] == f"{tmp_path}/cache/pagedllm/tiny-llama.hf"
    assert (record["dtype"], record["kv_cache_space"]) == ("auto", "3")


def test_throughput_result_checks_every_request() -> None:
    requests = [BenchRequest([5, 6, 7], 4), BenchRequest([8], 2)]
    result = {"vllm_version": "x", "dtype": "float32", "startup_s": 80.0, "elapsed_s": 2.0}
    result |= {"prompt_tokens": [3, 1], "output_tokens": [4, 2]}
    counted = throughput_result(requests, result, PEER)
    assert (counted.input_tokens, counted.output_tokens, counted.startup_s) == (4, 6, 80.0)
    assert counted.total_tokens_per_s == 5.0
    result["output_tokens"] = [4, 1]
    with pytest.raises(RuntimeError, match=r"request 1 asked for \(prompt, output\) tokens"):
        throughput_result(requests, result, PEER)


def test_latency_samples_follow_latency_sample() -> None:
    batches = [[BenchRequest([1, 2], 5)] * 2, [BenchRequest([3, 4], 5)] * 2]
    timed = [{"first_token_s": [0.1, 0.2], "finish_s": [0.5, 0.6]}]
    timed.append({"first_token_s": [0.3, 0.3], "finish_s": [0.9, 1.1]})
    samples = latency_samples(batches, {"batches": timed})
    assert samples == [latency_sample(t["first_token_s"], t["finish_s"], 5) for t in timed]
    assert samples[0].ttft_s == pytest.approx(0.15) and samples[1].e2e_s == 1.1


def test_a_failing_vllm_is_a_row_not_a_crash(
    run_bench: Callable[[list[str]], str],
    tiny_model_path: Callable[[str], str],
    fake_vllm: Callable[[], dict],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FAKE_VLLM_FAIL", "1")
    argv = ["throughput", "--model", tiny_model_path(TINY_MODEL), "--backend", "vllm"]
    out = run_bench([*argv, "--num-prompts", "2", "--vllm-python", sys.executable])
    assert f"vllm                failed: vLLM ({sys.executable}) exited with status 1" in out


@pytest.mark.parametrize("benchmark", ["throughput", "latency"])
def test_backend_vllm_needs_vllm_python(
    run_bench: Callable[[list[str]], str], tiny_model_path: Callable[[str], str], benchmark: str
) -> None:
    argv = [benchmark, "--model", tiny_model_path(TINY_MODEL), "--backend", "pagedllm,vllm"]
    with pytest.raises(ValueError, match="--backend vllm needs --vllm-python PATH"):
        run_bench(argv)


def test_vllm_python_must_import_vllm(
    run_bench: Callable[[list[str]], str],
    tiny_model_path: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: object,
) -> None:
    monkeypatch.delenv("PYTHONPATH", raising=False)
    argv = ["latency", "--model", tiny_model_path(TINY_MODEL), "--backend", "vllm"]
    with pytest.raises(ValueError, match=re.escape(f"--vllm-python '{sys.executable}' cannot")):
        run_bench([*argv, "--vllm-python", sys.executable])
    missing = f"{tmp_path}/no/python"
    with pytest.raises(ValueError, match=re.escape(f"'{missing}' is not an executable")):
        run_bench([*argv, "--vllm-python", missing])
    with pytest.raises(ValueError, match="vLLM KV cache 0 GiB must be a whole number >= 1"):
        run_bench([*argv, "--vllm-python", sys.executable, "--vllm-kv-cache-gib", "0"])
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "2.5")
    with pytest.raises(ValueError, match="vLLM KV cache '2.5' GiB must be a whole number"):
        run_bench([*argv, "--vllm-python", sys.executable])
