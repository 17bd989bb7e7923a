"""`pagedllm bench latency` on a tiny model: statistics are well formed (p50 <= p90 <= p99,
TTFT < E2E) and the bound is bandwidth / weight bytes (of the GGUF file when it runs as
stored); not how fast."""

import json
from collections.abc import Callable

import pytest
from gguf import GGUFReader

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
    assert report["bandwidth_bytes_per_s"] > 0
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
        percent = 100 * result["decode_tokens_per_s"] / report["bound_tokens_per_s"]
        assert result["percent_of_bound"] == pytest.approx(percent)
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
