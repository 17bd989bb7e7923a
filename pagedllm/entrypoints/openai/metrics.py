"""Prometheus metrics for /metrics under vLLM's names (`vllm:num_requests_running`,
`vllm:kv_cache_usage_perc`, `vllm:time_to_first_token_seconds`, ...), so routers and
dashboards built for vLLM (vllm-router, llm-d, production-stack, Grafana boards) read a
pagedllm server as they read vLLM. Metrics vLLM does not have are `pagedllm:` (KV blocks in
use and in total, the prefix cache's hit rate).

Engine state and counters (requests running and waiting, KV blocks, prefix cache,
preemptions, prompt and generated tokens) are read at scrape time from the EngineStats
snapshot the engine thread publishes after each step, one per data-parallel replica,
labelled `engine="0"`, `engine="1"`, ... as vLLM labels them (a router in front of several
servers reads each replica's load). Latency histograms and finished
requests are observed here, from each request's stream of outputs.
Each app gets its own registry, so several servers can live in one process (tests).
"""

import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import aclosing

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pagedllm.engine.stats import EngineStats
from pagedllm.outputs import RequestOutput

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0)
TTFT_BUCKETS += (2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0)
TPOT_BUCKETS += (2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0)
E2E_BUCKETS += (60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
TOKEN_BUCKETS = tuple(float(m * 10**e) for e in range(6) for m in (1, 2, 5))


class EngineStatsCollector(Collector):
    """Gauges and counters from each engine replica's latest EngineStats snapshot."""

    def __init__(self, read_stats: Callable[[], list[EngineStats]], model_name: str) -> None:
        self.read_stats = read_stats
        self.model_name = model_name

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        for engine, stats in enumerate(self.read_stats()):
            for kind, name, doc, value in _stats_rows(stats):
                family = families.get(name)
                if family is None:
                    family = families[name] = kind(name, doc, labels=["model_name", "engine"])
                family.add_metric([self.model_name, str(engine)], value)
        yield from families.values()


def _stats_rows(s: EngineStats) -> list[tuple[type, str, str, float]]:
    """(metric family, name, help, value) of each gauge and counter of one replica."""
    gauge, counter = GaugeMetricFamily, CounterMetricFamily
    hit_rate = s.prefix_cache_hits / s.prefix_cache_queries if s.prefix_cache_queries else 0
    in_use = s.num_blocks - s.num_free_blocks
    return [
        (gauge, "vllm:num_requests_running", "Sequences in the running batch.", s.num_running),
        (gauge, "vllm:num_requests_waiting", "Sequences waiting to run.", s.num_waiting),
        (gauge, "vllm:kv_cache_usage_perc", "Fraction of KV blocks in use.", s.kv_cache_usage),
        (gauge, "pagedllm:kv_cache_blocks_in_use", "KV blocks in use.", in_use),
        (gauge, "pagedllm:kv_cache_blocks_total", "KV blocks in the cache.", s.num_blocks),
        (
            gauge,
            "pagedllm:prefix_cache_hit_rate",
            "Prompt tokens found cached / looked up.",
            hit_rate,
        ),
        (
            counter,
            "vllm:prefix_cache_queries",
            "Prompt tokens looked up.",
            s.prefix_cache_queries,
        ),
        (counter, "vllm:prefix_cache_hits", "Prompt tokens found cached.", s.prefix_cache_hits),
        (counter, "vllm:num_preemptions", "Sequences preempted.", s.num_preemptions),
        (counter, "vllm:prompt_tokens", "Prompt tokens prefilled.", s.num_prompt_tokens),
        (counter, "vllm:generation_tokens", "Tokens generated.", s.num_generation_tokens),
    ]


class ServerMetrics:
    def __init__(self, read_stats: Callable[[], list[EngineStats]], model_name: str) -> None:
        self.registry = CollectorRegistry()
        self.model_name = model_name
        labels, registry = ["model_name"], self.registry
        self.request_success = Counter(
            "vllm:request_success",
            "Finished completions by finish reason.",
            labels + ["finished_reason"],
            registry=registry,
        )
        self.time_to_first_token = Histogram(
            "vllm:time_to_first_token_seconds",
            "Time from arrival to the first generated token.",
            labels,
            buckets=TTFT_BUCKETS,
            registry=registry,
        )
        self.time_per_output_token = Histogram(
            "vllm:time_per_output_token_seconds",
            "Mean time between a request's tokens after the first.",
            labels,
            buckets=TPOT_BUCKETS,
            registry=registry,
        )
        self.e2e_request_latency = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Time from arrival to the last output.",
            labels,
            buckets=E2E_BUCKETS,
            registry=registry,
        )
        self.inter_token_latency = Histogram(
            "vllm:inter_token_latency_seconds",
            "Time between a request's successive tokens (an output of several tokens counts "
            "its time once per token).",
            labels,
            buckets=TPOT_BUCKETS,
            registry=registry,
        )
        self.request_prompt_tokens = Histogram(
            "vllm:request_prompt_tokens",
            "Prompt tokens of each finished request.",
            labels,
            buckets=TOKEN_BUCKETS,
            registry=registry,
        )
        self.request_generation_tokens = Histogram(
            "vllm:request_generation_tokens",
            "Generated tokens of each finished request.",
            labels,
            buckets=TOKEN_BUCKETS,
            registry=registry,
        )
        registry.register(EngineStatsCollector(read_stats, model_name))

    def render(self) -> bytes:
        return generate_latest(self.registry)

    async def track(
        self, outputs: AsyncIterator[RequestOutput], arrival_time: float
    ) -> AsyncIterator[RequestOutput]:
        """Pass a request's DELTA outputs through, observing its latencies; closing this
        iterator closes `outputs` (which aborts the request)."""
        first_token_time, last_token_time, num_tokens = None, None, 0
        label = self.model_name
        async with aclosing(outputs):
            async for output in outputs:
                now = time.monotonic()
                new_tokens = sum(len(c.token_ids) for c in output.outputs)
                if new_tokens and first_token_time is None:
                    first_token_time = now
                    self.time_to_first_token.labels(label).observe(now - arrival_time)
                elif new_tokens:
                    gap = (now - last_token_time) / new_tokens
                    for _ in range(new_tokens):
                        self.inter_token_latency.labels(label).observe(gap)
                if new_tokens:
                    last_token_time = now
                num_tokens += new_tokens
                if output.finished:
                    self._observe_finished(output, now - arrival_time, first_token_time, num_tokens)
                yield output

    def _observe_finished(
        self, output: RequestOutput, latency: float, first_token_time: float | None, n: int
    ) -> None:
        label = self.model_name
        self.e2e_request_latency.labels(label).observe(latency)
        self.request_prompt_tokens.labels(label).observe(len(output.prompt_token_ids or ()))
        self.request_generation_tokens.labels(label).observe(n)
        if first_token_time is not None and n > 1:
            decode_time = time.monotonic() - first_token_time
            self.time_per_output_token.labels(label).observe(decode_time / (n - 1))
        for completion in output.outputs:
            self.request_success.labels(label, completion.finish_reason).inc()
