"""`pagedllm bench latency` on a tiny model: statistics are well formed (p50 <= p90 <= p99,
TTFT < E2E) and the bound is bandwidth / weight bytes; not how fast."""

import json
from collections.abc import Callable

import pytest

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
