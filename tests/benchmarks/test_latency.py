"""`pagedllm bench latency` on a tiny model: statistics are well formed (p50 <= p90 <= p99,
TTFT < E2E) and the bound is bandwidth / weight bytes (of the GGUF file when it runs as
stored), each run against the bandwidth probed around it; not how fast."""

import argparse
import json
import statistics
from collections.abc import Callable

import pytest
from gguf import GGUFReader

from pagedllm.benchmarks import latency
from pagedllm.benchmarks.metrics import LatencySample
from pagedllm.config import ModelConfig
from pagedllm.model_loader.loader import build_model, weight_bytes
from tests.benchmarks.conftest import TINY_ENGINE_FLAGS, TINY_MODEL


def test_latency_statistics_and_bound(
    run_bench: Callable[[list[str]], str],
    tiny_model_path: Callable[[str], str],
    tmp_path: object,
) -> None:
    json_path = f"{tmp_path}/latency.json"
    argv = ["latency", "--model", tiny_model_path(TINY_MODEL), "--backend", "pagedllm,hf"]
    argv += ["--batch-size", "2", "--input-len", "8", "--output-len", "4", "--num-iters", "3"]
    argv += ["--bandwidth-mb", "8", "--json", json_path]
    out = run_bench(argv + TINY_ENGINE_FLAGS)

    report = json.load(open(json_path))
    probes = report["bandwidth_probes_bytes_per_s"]
    assert len(probes) == 2 * (1 + 3 + 1)  # per backend: before each run and after the last
    assert report["bandwidth_bytes_per_s"] == statistics.median(probes) > 0
    assert f"(median of 10 probes around the runs, {min(probes) / 1e9:.2f}-" in out
    assert report["weight_bytes"] > 0
    bound = 2 * report["bandwidth_bytes_per_s"] / report["weight_bytes"]
    assert report["bound_tokens_per_s"] == pytest.approx(bound)
    for backend in ("pagedllm", "hf"):
        result = report["results"][backend]
        for key in ("ttft_s", "tpot_s", "e2e_s"):
            stats = result[key]
            assert 0 < stats["p50"] <= stats["p90"] <= stats["p99"], (backend, key, stats)
        assert result["ttft_s"]["mean"] < result["e2e_s"]["mean"]
        assert result["decode_tokens_per_s"] == pytest.approx(2 / result["tpot_s"]["mean"])
        assert len(result["bandwidths_bytes_per_s"]) == 3
        assert set(result["bandwidths_bytes_per_s"]) <= set(probes)
        assert result["percent_of_bound"] > 0
        assert f"[{backend}]" in out
    assert "TTFT ms" in out and "of the bandwidth bound" in out


def test_latency_rejects_output_len_1(
    run_bench: Callable[[list[str]], str], tiny_model_path: Callable[[str], str]
) -> None:
    with pytest.raises(ValueError, match="--output-len 1 must be >= 2"):
        run_bench(["latency", "--model", tiny_model_path(TINY_MODEL), "--output-len", "1"])


def test_latency_on_a_q8_0_copy_bounds_by_the_file_bytes(
    run_bench: Callable[[list[str]], str],
    tiny_gguf_path: str,
    tmp_path: object,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """--gguf-type: every backend loads the copy; run as stored, a step reads the file's bytes
    (gguf.GGUFReader's), dequantized (--quantization none) the float32 parameters."""
    monkeypatch.setenv("XDG_CACHE_HOME", f"{tmp_path}/cache")
    argv = ["latency", "--model", tiny_gguf_path, "--gguf-type", "q8_0", "--backend", "pagedllm,hf"]
    argv += ["--input-len", "8", "--output-len", "3", "--num-iters", "1", "--num-warmup", "0"]
    argv += ["--bandwidth-mb", "8", "--dtype", "float32", *TINY_ENGINE_FLAGS]
    copy = f"{tmp_path}/cache/pagedllm/tiny-llama.Q8_0.gguf"
    reports = {}
    for quantization in ("gguf", "none"):
        json_path = f"{tmp_path}/{quantization}.json"
        run_bench([*argv, "--quantization", quantization, "--json", json_path])
        reports[quantization] = json.load(open(json_path))
        assert reports[quantization]["config"]["model"] == copy
        assert reports[quantization]["config"]["quantization"] == quantization
        assert set(reports[quantization]["results"]) == {"pagedllm", "hf"}
    file_bytes = sum(int(t.n_bytes) for t in GGUFReader(copy).tensors)
    assert reports["gguf"]["weight_bytes"] == file_bytes
    model_config = ModelConfig.create(copy, "float32", quantization="none")
    model = build_model(model_config, "meta")
    assert reports["none"]["weight_bytes"] == weight_bytes(model, buffers=False)
    assert reports["none"]["weight_bytes"] > file_bytes


def test_each_run_is_held_to_the_bandwidth_probed_around_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fake backend whose runs take 10, 20, 40 ms a token; probes read 1, 3, 2, 8, 4 GB/s in
    turn (before the warm-up run, between runs, after the last): each run gets the better of
    the probes on either side (3, 3, 8, 8 GB/s), warm-up dropped, and the percentage is the
    median of the runs' own."""
    tpots = iter([0.005, 0.010, 0.020, 0.040])
    sample = lambda batch: LatencySample(0.1, next(tpots), 1.0)  # noqa: E731
    monkeypatch.setitem(latency._RUNNERS, "fake", lambda args, config: sample)
    probes = iter([1e9, 3e9, 2e9, 8e9, 4e9])
    args = argparse.Namespace(batch_size=1, num_warmup=1, device="cpu")
    result = latency.run_backend("fake", args, None, [[]] * 4, lambda: next(probes), 10**8)
    assert result["bandwidths_bytes_per_s"] == [3e9, 8e9, 8e9]
    bounds = [30.0, 80.0, 80.0]  # tokens/s: bandwidth / 10**8 bytes
    percents = [100 * (1 / t) / b for t, b in zip([0.010, 0.020, 0.040], bounds, strict=True)]
    assert result["percent_of_bound"] == pytest.approx(statistics.median(percents))
    assert next(probes, None) is None  # one probe before the first run and one after each


def test_vllm_runs_are_held_to_the_probes_around_its_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    samples = [LatencySample(0.1, 0.01, 1.0)] * 3
    monkeypatch.setattr(latency, "vllm_peer", lambda args: None)
    monkeypatch.setattr(latency, "run_vllm_latency", lambda *a: ({"startup_s": 1.0}, samples))
    probes = iter([2e9, 5e9])
    args = argparse.Namespace(batch_size=1, num_warmup=0, device="cpu")
    result = latency.run_backend("vllm", args, None, [[]] * 3, lambda: next(probes), 10**8)
    assert result["bandwidths_bytes_per_s"] == [5e9] * 3
    assert result["percent_of_bound"] == pytest.approx(100 * 100 / 50)
