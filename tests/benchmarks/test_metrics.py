"""pagedllm/benchmarks/metrics.py on hand-made numbers. References: the definitions: the
arithmetic mean; percentiles by linear interpolation between closest ranks (the value at
position p/100 * (n - 1) of the sorted data, numpy's default and Excel's PERCENTILE.INC);
rates as counts over elapsed time; vLLM's TTFT, TPOT = (finish - first token) / (output
tokens - 1) and e2e."""

import pytest
import torch

from pagedllm.benchmarks.metrics import (
    BackendUnavailable,
    ThroughputResult,
    check_same_device,
    free_backend_memory,
    latency_sample,
    ratios,
    summarize,
)


def test_summarize_mean_and_interpolated_percentiles() -> None:
    """1..10 shuffled: sorted positions 4.5, 8.1 and 8.91 give 5.5, 9.1 and 9.91."""
    stats = summarize([7.0, 1.0, 10.0, 3.0, 5.0, 2.0, 9.0, 4.0, 8.0, 6.0])
    assert stats == pytest.approx({"mean": 5.5, "p50": 5.5, "p90": 9.1, "p99": 9.91})


def test_summarize_skewed_data_orders_the_percentiles() -> None:
    """Three 1s and a 100: mean 25.75; positions 1.5, 2.7, 2.97 of [1, 1, 1, 100]."""
    stats = summarize([1.0, 100.0, 1.0, 1.0])
    assert stats == pytest.approx({"mean": 25.75, "p50": 1.0, "p90": 70.3, "p99": 97.03})
    assert stats["p50"] <= stats["p90"] <= stats["p99"]


def test_summarize_one_value_is_every_statistic() -> None:
    assert summarize([0.25]) == {"mean": 0.25, "p50": 0.25, "p90": 0.25, "p99": 0.25}


def result(backend: str, elapsed_s: float) -> ThroughputResult:
    return ThroughputResult(
        backend,
        num_requests=10,
        input_tokens=1000,
        output_tokens=500,
        elapsed_s=elapsed_s,
        startup_s=3.0,
    )


def test_throughput_rates_exclude_startup() -> None:
    """10 requests, 1000 + 500 tokens in 2.5 s (3 s of start-up not counted)."""
    ours = result("pagedllm", 2.5)
    assert ours.requests_per_s == pytest.approx(4.0)
    assert ours.total_tokens_per_s == pytest.approx(600.0)
    assert ours.output_tokens_per_s == pytest.approx(200.0)
    assert ours.to_dict() == {
        "backend": "pagedllm",
        "num_requests": 10,
        "input_tokens": 1000,
        "output_tokens": 500,
        "elapsed_s": 2.5,
        "startup_s": 3.0,
        "detail": "",
        "profile": None,
        "steps": None,
        "requests_per_s": pytest.approx(4.0),
        "total_tokens_per_s": pytest.approx(600.0),
        "output_tokens_per_s": pytest.approx(200.0),
    }


def test_ratios_above_1_mean_pagedllm_is_faster() -> None:
    """The same work in 2 s against the peer's 5 s: 2.5x on every rate."""
    assert ratios(result("pagedllm", 2.0), result("hf", 5.0)) == pytest.approx(
        {"requests_per_s": 2.5, "total_tokens_per_s": 2.5, "output_tokens_per_s": 2.5}
    )


def test_latency_sample_means_over_the_batch() -> None:
    """Two requests of 4 tokens: first tokens at 0.1 and 0.3 s, done at 1.0 and 1.5 s:
    TTFT (0.1 + 0.3) / 2, TPOT ((0.9 / 3) + (1.2 / 3)) / 2, e2e the later finish."""
    sample = latency_sample([0.1, 0.3], [1.0, 1.5], output_len=4)
    assert sample.ttft_s == pytest.approx(0.2)
    assert sample.tpot_s == pytest.approx(0.35)
    assert sample.e2e_s == 1.5


@pytest.mark.parametrize("backend", ["llama.cpp", "vllm"])
@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_cpu_only_peers_are_skipped_when_pagedllm_runs_elsewhere(backend, device) -> None:
    with pytest.raises(BackendUnavailable, match=f"{backend} runs on the CPU only"):
        check_same_device(backend, device)


@pytest.mark.parametrize(
    "backend, device",
    [("llama.cpp", "cpu"), ("vllm", "cpu"), ("hf", "cuda"), ("pagedllm", "cuda:1")],
)
def test_peers_on_pagedllm_s_device_run(backend, device) -> None:
    check_same_device(backend, device)


def test_between_backends_a_gpus_cached_blocks_are_released(monkeypatch) -> None:
    """The next backend gets the memory the last one's engine held, not only after an OOM."""
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    free_backend_memory()
    assert calls == ["empty_cache"]
