"""pagedllm/entrypoints/openai/metrics.py. References: Prometheus' text format (parsed with
prometheus_client's own parser) and vLLM's definitions of the latency metrics: TTFT = first
token - arrival, TPOT = (last token - first token) / (tokens - 1), e2e = last output -
arrival; request_success counts each completion by finish reason."""

import asyncio
from collections.abc import AsyncIterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pagedllm.engine.stats import EngineStats
from pagedllm.entrypoints.openai import metrics as metrics_module
from pagedllm.entrypoints.openai.metrics import ServerMetrics
from pagedllm.outputs import CompletionOutput, RequestOutput

MODEL = "m"

STATS = EngineStats(
    num_running=3,
    num_waiting=2,
    num_preemptions=1,
    kv_cache_usage=0.25,
    num_free_blocks=75,
    num_blocks=100,
    prefix_cache_queries=40,
    prefix_cache_hits=10,
    num_prompt_tokens=123,
    num_generation_tokens=456,
)


def scrape(metrics: ServerMetrics) -> dict[str, float]:
    """Sample name -> value for the samples labelled with MODEL (and engine 0, if any:
    the engine's stats; no other label)."""
    families = text_string_to_metric_families(metrics.render().decode())
    wanted = ({"model_name": MODEL}, {"model_name": MODEL, "engine": "0"})
    return {s.name: s.value for f in families for s in f.samples if s.labels in wanted}


def test_render_exposes_the_engine_stats_snapshot() -> None:
    """Gauges as they are, blocks in use = total - free, hit rate = hits / queries,
    counters with Prometheus' _total suffix."""
    values = scrape(ServerMetrics(lambda: [STATS], MODEL))
    assert values["vllm:num_requests_running"] == 3
    assert values["vllm:num_requests_waiting"] == 2
    assert values["vllm:kv_cache_usage_perc"] == 0.25
    assert values["pagedllm:kv_cache_blocks_in_use"] == 25
    assert values["pagedllm:kv_cache_blocks_total"] == 100
    assert values["pagedllm:prefix_cache_hit_rate"] == 0.25
    assert values["vllm:prefix_cache_queries_total"] == 40
    assert values["vllm:prefix_cache_hits_total"] == 10
    assert values["vllm:num_preemptions_total"] == 1
    assert values["vllm:prompt_tokens_total"] == 123
    assert values["vllm:generation_tokens_total"] == 456


def test_render_reads_the_latest_snapshot_and_hit_rate_is_0_without_queries() -> None:
    snapshot = {"stats": STATS}
    metrics = ServerMetrics(lambda: [snapshot["stats"]], MODEL)
    assert scrape(metrics)["vllm:num_requests_running"] == 3
    snapshot["stats"] = EngineStats(0, 0, 0, 0.0, 100, 100, 0, 0, 0, 0)
    values = scrape(metrics)
    assert values["vllm:num_requests_running"] == 0
    assert values["pagedllm:prefix_cache_hit_rate"] == 0


def test_two_servers_in_one_process_have_their_own_registries() -> None:
    """Each ServerMetrics owns a registry: a second one raises no duplicate-metric error
    and observations on one do not show in the other."""
    a, b = ServerMetrics(lambda: [STATS], MODEL), ServerMetrics(lambda: [STATS], MODEL)
    a.time_to_first_token.labels(MODEL).observe(1.0)
    assert scrape(a)["vllm:time_to_first_token_seconds_count"] == 1
    assert "vllm:time_to_first_token_seconds_count" not in scrape(b)


class Clock:
    """time.monotonic for the metrics module, moved by the fake engine stream."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


def output(new_tokens: list[list[int]], finished: bool, reasons: list[str | None]) -> RequestOutput:
    """A DELTA output with one CompletionOutput per entry of `new_tokens`."""
    completions = [
        CompletionOutput(i, "", ids, finish_reason=reason)
        for i, (ids, reason) in enumerate(zip(new_tokens, reasons))
    ]
    return RequestOutput("r", "p", [1, 2], None, completions, finished)


async def engine_stream(
    clock: Clock, steps: list[tuple[float, RequestOutput]], closed: list[bool]
) -> AsyncIterator[RequestOutput]:
    try:
        for at, out in steps:
            clock.now = at
            yield out
    finally:
        closed.append(True)


async def drain(stream: AsyncIterator[RequestOutput]) -> list[RequestOutput]:
    return [out async for out in stream]


def test_track_observes_ttft_tpot_itl_e2e_and_token_counts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Arrival at 10 s; an output with no token at 10.5 s (a prefill chunk), 1 token at
    11 s, 2 at 12 s, 2 and finished at 14 s: TTFT 1 s, TPOT (14 - 11) / (5 - 1), e2e 4 s;
    inter-token latencies 0.5, 0.5 (the 2 tokens at 12 s), 1, 1; 2 prompt and 5 generated
    tokens."""
    clock = Clock()
    monkeypatch.setattr(metrics_module, "time", clock)
    steps = [
        (10.5, output([[]], False, [None])),
        (11.0, output([[5]], False, [None])),
        (12.0, output([[6, 7]], False, [None])),
        (14.0, output([[8, 9]], True, ["length"])),
    ]
    metrics, closed = ServerMetrics(lambda: [STATS], MODEL), []
    seen = asyncio.run(drain(metrics.track(engine_stream(clock, steps, closed), 10.0)))
    assert seen == [out for _, out in steps]  # passed through unchanged
    values = scrape(metrics)
    assert values["vllm:time_to_first_token_seconds_count"] == 1
    assert values["vllm:time_to_first_token_seconds_sum"] == pytest.approx(1.0)
    assert values["vllm:time_per_output_token_seconds_count"] == 1
    assert values["vllm:time_per_output_token_seconds_sum"] == pytest.approx(3.0 / 4)
    assert values["vllm:e2e_request_latency_seconds_count"] == 1
    assert values["vllm:e2e_request_latency_seconds_sum"] == pytest.approx(4.0)
    assert values["vllm:inter_token_latency_seconds_count"] == 4
    assert values["vllm:inter_token_latency_seconds_sum"] == pytest.approx(3.0)
    assert values["vllm:request_prompt_tokens_sum"] == 2
    assert values["vllm:request_generation_tokens_sum"] == 5
    assert closed == [True]


def test_track_counts_each_completion_by_finish_reason() -> None:
    """n=3: one request_success per completion, labelled with its finish reason."""
    clock, metrics = Clock(), ServerMetrics(lambda: [STATS], MODEL)
    steps = [(1.0, output([[5], [6], [7]], True, ["length", "stop", "stop"]))]
    asyncio.run(drain(metrics.track(engine_stream(clock, steps, []), 0.0)))
    families = text_string_to_metric_families(metrics.render().decode())
    success = {
        s.labels["finished_reason"]: s.value
        for f in families
        for s in f.samples
        if s.name == "vllm:request_success_total"
    }
    assert success == {"length": 1, "stop": 2}


def test_track_single_token_request_has_no_tpot(monkeypatch: pytest.MonkeyPatch) -> None:
    """TPOT needs two tokens (its denominator is tokens - 1)."""
    clock = Clock()
    monkeypatch.setattr(metrics_module, "time", clock)
    metrics = ServerMetrics(lambda: [STATS], MODEL)
    steps = [(2.0, output([[5]], True, ["length"]))]
    asyncio.run(drain(metrics.track(engine_stream(clock, steps, []), 0.0)))
    values = scrape(metrics)
    assert values["vllm:time_to_first_token_seconds_sum"] == pytest.approx(2.0)
    assert "vllm:time_per_output_token_seconds_count" not in values  # never observed
    assert values["vllm:e2e_request_latency_seconds_count"] == 1


def test_closing_track_early_closes_the_engine_stream_and_counts_no_finish() -> None:
    """A client that goes away: closing the tracked stream closes the engine's (which
    aborts the request); an unfinished request is no success."""
    clock, closed = Clock(), []
    metrics = ServerMetrics(lambda: [STATS], MODEL)
    steps = [(1.0, output([[5]], False, [None])), (2.0, output([[6]], True, ["length"]))]

    async def first_then_close() -> None:
        tracked = metrics.track(engine_stream(clock, steps, closed), 0.0)
        await anext(tracked)
        await tracked.aclose()

    asyncio.run(first_then_close())
    assert closed == [True]
    values = scrape(metrics)
    assert values["vllm:time_to_first_token_seconds_count"] == 1
    assert "vllm:e2e_request_latency_seconds_count" not in values
    assert "vllm:request_success_total" not in values
