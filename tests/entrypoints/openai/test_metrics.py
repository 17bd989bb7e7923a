"""pagedllm/entrypoints/openai/metrics.py and metrics_engine.py. References: Prometheus' text
format (parsed with prometheus_client's own parser) and vLLM's definitions (its
vllm/v1/metrics/loggers.py and stats.py): TTFT = first token - arrival, TPOT = (last token -
first token) / (tokens - 1), e2e = last output - arrival, queue = first scheduled - arrival,
prefill = first token - first scheduled, decode = last token - first token, inference =
last token - first scheduled; request_success counts each completion by finish reason;
token-count buckets 1, 2, 5, 10, ... up to max_model_len; labels model_name and engine."""

import asyncio
import dataclasses
from collections.abc import AsyncIterator

import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from pagedllm.config import CacheConfig
from pagedllm.engine.stats import (
    ITERATION_TOKENS_BUCKETS,
    EngineStats,
    HistogramCounts,
    LoRAStats,
    SpecDecodingStats,
)
from pagedllm.entrypoints.openai import metrics as metrics_module
from pagedllm.entrypoints.openai import metrics_engine
from pagedllm.entrypoints.openai.metrics import ServerMetrics, build_1_2_5_buckets
from pagedllm.outputs import CompletionOutput, PoolingOutput, PoolingRequestOutput, RequestOutput
from pagedllm.sampling_params import SamplingParams

MODEL = "m"
LABELS = {"model_name": MODEL, "engine": "0"}
MAX_MODEL_LEN = 300

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


def make_metrics(read_stats=lambda: [STATS]) -> ServerMetrics:
    return ServerMetrics(read_stats, MODEL, MAX_MODEL_LEN, CacheConfig(block_size=32))


def scrape(metrics: ServerMetrics) -> dict[str, float]:
    """Sample name -> value for the samples labelled with LABELS (and no other label)."""
    families = text_string_to_metric_families(metrics.render().decode())
    return {s.name: s.value for f in families for s in f.samples if s.labels == LABELS}


def buckets(metrics: ServerMetrics, name: str) -> dict[float, float]:
    """Upper bound -> cumulative count of histogram `name`'s buckets."""
    families = text_string_to_metric_families(metrics.render().decode())
    return {
        float(s.labels["le"]): s.value
        for f in families
        for s in f.samples
        if s.name == name + "_bucket"
    }


def test_render_exposes_the_engine_stats_snapshot() -> None:
    """Gauges as they are, blocks in use = total - free, hit rate = hits / queries,
    counters with Prometheus' _total suffix."""
    values = scrape(make_metrics())
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


def test_spec_decode_counters_only_where_the_engine_speculates() -> None:
    """vLLM's vllm:spec_decode_* counters, from the snapshot's SpecDecodingStats."""
    assert not any(name.startswith("vllm:spec_decode") for name in scrape(make_metrics()))
    spec_decoding = SpecDecodingStats()
    for drafted, accepted in [(4, 4), (4, 1), (3, 2), (2, 0)]:
        spec_decoding.observe(drafted, accepted)
    spec = dataclasses.replace(STATS, spec_decoding=spec_decoding)
    metrics = make_metrics(lambda: [spec])
    values = scrape(metrics)
    assert values["vllm:spec_decode_num_drafts_total"] == 4
    assert values["vllm:spec_decode_num_draft_tokens_total"] == 13
    assert values["vllm:spec_decode_num_accepted_tokens_total"] == 7
    # Accepted at draft positions 0..3: drafts accepted up to their first rejection.
    families = text_string_to_metric_families(metrics.render().decode())
    per_pos = {
        s.labels["position"]: s.value
        for f in families
        for s in f.samples
        if s.name == "vllm:spec_decode_num_accepted_tokens_per_pos_total"
    }
    assert per_pos == {"0": 3, "1": 2, "2": 1, "3": 1}


def test_lora_requests_info_only_where_lora_is_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's vllm:lora_requests_info: the adapters running and waiting (names joined by
    commas) and max_lora as labels, set to the time of the scrape."""
    assert "vllm:lora_requests_info" not in scrape(make_metrics())
    monkeypatch.setattr(metrics_engine.time, "time", lambda: 1234.5)
    lora = LoRAStats(max_lora=2, running=["a", "b"], waiting=["c"])
    metrics = make_metrics(lambda: [dataclasses.replace(STATS, lora=lora)])
    families = text_string_to_metric_families(metrics.render().decode())
    (sample,) = [s for f in families for s in f.samples if s.name == "vllm:lora_requests_info"]
    assert sample.labels == {
        "max_lora": "2",
        "running_lora_adapters": "a,b",
        "waiting_lora_adapters": "c",
        "engine": "0",
    }
    assert sample.value == 1234.5


def test_render_reads_the_latest_snapshot_and_hit_rate_is_0_without_queries() -> None:
    snapshot = {"stats": STATS}
    metrics = make_metrics(lambda: [snapshot["stats"]])
    assert scrape(metrics)["vllm:num_requests_running"] == 3
    snapshot["stats"] = EngineStats(0, 0, 0, 0.0, 100, 100, 0, 0, 0, 0)
    values = scrape(metrics)
    assert values["vllm:num_requests_running"] == 0
    assert values["pagedllm:prefix_cache_hit_rate"] == 0


def test_two_servers_in_one_process_have_their_own_registries() -> None:
    """Each ServerMetrics owns a registry: a second one raises no duplicate-metric error
    and observations on one do not show in the other (whose series exist at 0, as vLLM's
    do before any request)."""
    a, b = make_metrics(), make_metrics()
    a.time_to_first_token.labels(MODEL, "0").observe(1.0)
    assert scrape(a)["vllm:time_to_first_token_seconds_count"] == 1
    assert scrape(b)["vllm:time_to_first_token_seconds_count"] == 0


PARAMS = SamplingParams(max_tokens=16)


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
    metrics, closed = make_metrics(), []
    seen = asyncio.run(drain(metrics.track(engine_stream(clock, steps, closed), 10.0, PARAMS)))
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


def successes(metrics: ServerMetrics) -> dict[tuple[str, str], float]:
    """(engine, finished_reason) -> vllm:request_success_total."""
    families = text_string_to_metric_families(metrics.render().decode())
    return {
        (s.labels["engine"], s.labels["finished_reason"]): s.value
        for f in families
        for s in f.samples
        if s.name == "vllm:request_success_total"
    }


def test_every_finished_reason_series_exists_at_0_per_engine() -> None:
    """As vLLM's: before any request, each engine has a request_success series per
    FinishReason (stop, length, abort, error), at 0."""
    metrics = make_metrics(lambda: [STATS, STATS])
    reasons = ("stop", "length", "abort", "error")
    assert successes(metrics) == {(e, r): 0 for e in ("0", "1") for r in reasons}


def test_track_counts_each_completion_by_finish_reason() -> None:
    """n=3: one request_success per completion, labelled with its finish reason."""
    clock, metrics = Clock(), make_metrics()
    steps = [(1.0, output([[5], [6], [7]], True, ["length", "stop", "stop"]))]
    asyncio.run(drain(metrics.track(engine_stream(clock, steps, []), 0.0, PARAMS)))
    success = {reason: n for (_, reason), n in successes(metrics).items()}
    assert success == {"length": 1, "stop": 2, "abort": 0, "error": 0}


def test_track_single_token_request_has_no_tpot(monkeypatch: pytest.MonkeyPatch) -> None:
    """TPOT needs two tokens (its denominator is tokens - 1)."""
    clock = Clock()
    monkeypatch.setattr(metrics_module, "time", clock)
    metrics = make_metrics()
    steps = [(2.0, output([[5]], True, ["length"]))]
    asyncio.run(drain(metrics.track(engine_stream(clock, steps, []), 0.0, PARAMS)))
    values = scrape(metrics)
    assert values["vllm:time_to_first_token_seconds_sum"] == pytest.approx(2.0)
    assert values["vllm:time_per_output_token_seconds_count"] == 0  # never observed
    assert values["vllm:e2e_request_latency_seconds_count"] == 1


def test_closing_track_early_closes_the_engine_stream_and_counts_an_abort() -> None:
    """A client that goes away: closing the tracked stream closes the engine's (which
    aborts the request), counted as vLLM counts it: an "abort" success, no latency."""
    clock, closed = Clock(), []
    metrics = make_metrics()
    steps = [(1.0, output([[5]], False, [None])), (2.0, output([[6]], True, ["length"]))]

    async def first_then_close() -> None:
        tracked = metrics.track(engine_stream(clock, steps, closed), 0.0, PARAMS)
        await anext(tracked)
        await tracked.aclose()

    asyncio.run(first_then_close())
    assert closed == [True]
    values = scrape(metrics)
    assert values["vllm:time_to_first_token_seconds_count"] == 1
    assert values["vllm:e2e_request_latency_seconds_count"] == 0
    assert successes(metrics)[("0", "abort")] == 1
    assert successes(metrics)[("0", "length")] == 0


def test_a_cancelled_request_counts_its_unfinished_completions_as_aborts() -> None:
    """n=3, one completion already stopped when the consumer is cancelled (a client gone
    while its answer is collected): 1 stop and 2 aborts, on the replica that ran it."""
    clock, closed = Clock(), []
    metrics = make_metrics(lambda: [STATS, STATS])
    first = output([[5], [6], [7]], False, ["stop", None, None])
    first.engine_index = 1
    steps = [(1.0, first), (2.0, output([[], [8], [9]], True, ["stop", "length", "length"]))]
    params = SamplingParams(max_tokens=16, n=3)

    async def cancel_after_first() -> None:
        tracked = metrics.track(engine_stream(clock, steps, closed), 0.0, params)
        gate = asyncio.Event()

        async def consume() -> None:
            async for _ in tracked:
                gate.set()
                await asyncio.sleep(60)

        task = asyncio.create_task(consume())
        await gate.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await tracked.aclose()

    asyncio.run(cancel_after_first())
    assert closed == [True]
    counts = {key: n for key, n in successes(metrics).items() if n}
    assert counts == {("1", "stop"): 1, ("1", "abort"): 2}


def test_token_buckets_are_vllms_1_2_5_series_up_to_max_model_len() -> None:
    assert build_1_2_5_buckets(100) == (1, 2, 5, 10, 20, 50, 100)
    assert build_1_2_5_buckets(300) == (1, 2, 5, 10, 20, 50, 100, 200)
    values = buckets(make_metrics(), "vllm:request_prompt_tokens")
    assert sorted(values) == [1, 2, 5, 10, 20, 50, 100, 200, float("inf")]


def test_iteration_tokens_histogram_is_the_engines_counts_made_cumulative() -> None:
    """Steps of 1, 8, 9 and 20000 tokens: le=1 holds 1, le=8 holds 2, le=16 holds 3, the
    last bucket (16384) still 3 and +Inf all 4; sum 20018."""
    counts = HistogramCounts.empty(ITERATION_TOKENS_BUCKETS)
    for n in (1, 8, 9, 20000):
        counts.observe(n)
    stats = EngineStats(0, 0, 0, 0.0, 1, 1, 0, 0, 0, 0, counts)
    metrics = make_metrics(lambda: [stats])
    values = buckets(metrics, "vllm:iteration_tokens_total")
    assert (values[1], values[8], values[16], values[16384]) == (1, 2, 3, 3)
    assert values[float("inf")] == 4
    assert scrape(metrics)["vllm:iteration_tokens_total_sum"] == 20018


def test_cache_config_info_labels_the_cache_config_and_its_blocks() -> None:
    families = text_string_to_metric_families(make_metrics().render().decode())
    (sample,) = [s for f in families for s in f.samples if s.name == "vllm:cache_config_info"]
    assert sample.value == 1
    assert sample.labels["block_size"] == "32"
    assert sample.labels["num_gpu_blocks"] == "100"  # STATS.num_blocks
    assert sample.labels["enable_prefix_caching"] == "True"
    assert sample.labels["cache_dtype"] == "auto"
    assert sample.labels["engine"] == "0"


def test_track_observes_the_engines_phases_and_the_request_params() -> None:
    """Arrival 1, scheduled 3, first token 6, last token 10 (engine timestamps): queue 2,
    prefill 3, decode 4, inference 7. n=2 with completions of 3 and 1 tokens: generation
    tokens observed per completion (3, 1), the max 3 once, n 2 and max_tokens 16 once."""
    times = {
        "arrival_time": 1.0,
        "first_scheduled_time": 3.0,
        "first_token_time": 6.0,
        "last_token_time": 10.0,
    }
    first = output([[5, 6], [7]], False, [None, None])
    last = output([[8], []], True, ["length", "stop"])
    last.metrics = times
    metrics = make_metrics()
    params = SamplingParams(n=2, max_tokens=16)
    steps = [(1.0, first), (2.0, last)]
    asyncio.run(drain(metrics.track(engine_stream(Clock(), steps, []), 0.0, params)))
    values = scrape(metrics)
    for name, seconds in (("queue", 2), ("prefill", 3), ("decode", 4), ("inference", 7)):
        assert values[f"vllm:request_{name}_time_seconds_count"] == 1
        assert values[f"vllm:request_{name}_time_seconds_sum"] == seconds
    assert values["vllm:request_generation_tokens_count"] == 2
    assert values["vllm:request_generation_tokens_sum"] == 4
    assert values["vllm:request_max_num_generation_tokens_sum"] == 3
    assert values["vllm:request_params_n_sum"] == 2
    assert values["vllm:request_params_max_tokens_sum"] == 16
    assert buckets(metrics, "vllm:request_params_n")[2] == 1  # vLLM's n buckets: 1, 2, 5, ...


def test_a_request_never_scheduled_observes_no_phase() -> None:
    """Only the phases whose two timestamps the request reached."""
    done = output([[]], True, ["abort"])
    done.metrics = {"arrival_time": 1.0}
    metrics = make_metrics()
    asyncio.run(drain(metrics.track(engine_stream(Clock(), [(1.0, done)], []), 0.0, PARAMS)))
    values = scrape(metrics)
    assert values["vllm:request_queue_time_seconds_count"] == 0
    assert values["vllm:request_decode_time_seconds_count"] == 0


def test_track_pooling_counts_the_request_its_prompt_tokens_and_latency(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An embedding request: arrival 0 (server), done at 5; engine: arrival 1, scheduled 2,
    pooled 4 (its first = last "token"): queue 1, prefill 2, decode 0, inference 2."""
    clock = Clock()
    monkeypatch.setattr(metrics_module, "time", clock)
    pooled = PoolingRequestOutput("e", PoolingOutput(torch.zeros(2)), [1, 2, 3], True)
    pooled.metrics = {
        "arrival_time": 1.0,
        "first_scheduled_time": 2.0,
        "first_token_time": 4.0,
        "last_token_time": 4.0,
    }
    metrics = make_metrics()
    asyncio.run(drain(metrics.track_pooling(engine_stream(clock, [(5.0, pooled)], []), 0.0)))
    values = scrape(metrics)
    assert values["vllm:e2e_request_latency_seconds_sum"] == 5
    assert values["vllm:request_prompt_tokens_sum"] == 3
    phases = ("queue", 1), ("prefill", 2), ("decode", 0), ("inference", 2)
    for name, seconds in phases:
        assert values[f"vllm:request_{name}_time_seconds_sum"] == seconds
    families = text_string_to_metric_families(metrics.render().decode())
    success = [s for f in families for s in f.samples if s.name == "vllm:request_success_total"]
    assert [(s.labels["finished_reason"], s.value) for s in success if s.value] == [("stop", 1)]
    assert values["vllm:time_to_first_token_seconds_count"] == 0


def test_a_pooling_request_cancelled_before_its_output_counts_an_abort() -> None:
    """A /classify or /v1/embeddings client that goes away: its requests count as
    "abort", as a generating request's unfinished completions do."""
    metrics = make_metrics()

    async def never() -> AsyncIterator[PoolingRequestOutput]:
        await asyncio.Event().wait()
        yield  # never reached: the request is cancelled while it runs

    async def cancelled() -> None:
        task = asyncio.create_task(drain(metrics.track_pooling(never(), 0.0)))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancelled())
    assert successes(metrics)[("0", "abort")] == 1
    assert successes(metrics)[("0", "stop")] == 0
