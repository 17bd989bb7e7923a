"""Prometheus metrics for /metrics under vLLM's names (`vllm:num_requests_running`,
`vllm:kv_cache_usage_perc`, `vllm:time_to_first_token_seconds`, ...), types, labels
(`model_name`, `engine`) and buckets, so routers and dashboards built for vLLM
(vllm-router, llm-d, production-stack, Grafana boards) read a pagedllm server as they read
vLLM. Metrics vLLM does not have are `pagedllm:` (KV blocks in use and in total, the
prefix cache's hit rate).

Engine state and counters (requests running and waiting, KV blocks, prefix cache,
preemptions, prompt and generated tokens, tokens per step) are read at scrape time from
the EngineStats snapshot the engine thread publishes after each step. Per-request
histograms are observed here, from each request's stream of outputs: latencies as the
server sees them, and the engine's queue / prefill / decode / inference phases from the
finished output's timestamps (RequestOutput.metrics). Each app gets its own registry, so
several servers can live in one process (tests).
"""

import asyncio
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from pagedllm.config import CacheConfig
from pagedllm.engine.stats import EngineStats
from pagedllm.entrypoints.openai.metrics_engine import EngineStatsCollector
from pagedllm.outputs import PoolingRequestOutput, RequestOutput
from pagedllm.sampling_params import SamplingParams

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0)
TTFT_BUCKETS += (2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0)
TPOT_BUCKETS += (2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0)
REQUEST_LATENCY_BUCKETS += (40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
N_BUCKETS = (1, 2, 5, 10, 20)
ENGINE = "0"  # the `engine` label: one engine per server
# vLLM's FinishReason strings that a pagedllm request can end with (vLLM's "repetition"
# needs its repetition detection, which pagedllm has not): the `finished_reason` series.
FINISHED_REASONS = ("stop", "length", "abort", "error")
# vLLM's request phases: (histogram, from timestamp, to timestamp) of RequestOutput.metrics.
PHASES = (
    ("vllm:request_queue_time_seconds", "WAITING", "arrival_time", "first_scheduled_time"),
    ("vllm:request_prefill_time_seconds", "PREFILL", "first_scheduled_time", "first_token_time"),
    ("vllm:request_decode_time_seconds", "DECODE", "first_token_time", "last_token_time"),
    ("vllm:request_inference_time_seconds", "RUNNING", "first_scheduled_time", "last_token_time"),
)


def build_1_2_5_buckets(max_value: int) -> tuple[int, ...]:
    """vLLM's token-count buckets: 1, 2, 5, 10, 20, 50, ... up to max_value."""
    buckets, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_value:
                return tuple(buckets)
            buckets.append(m * scale)
        scale *= 10


class ServerMetrics:
    def __init__(
        self,
        read_stats: Callable[[], list[EngineStats]],
        model_name: str,
        max_model_len: int,
        cache_config: CacheConfig,
    ) -> None:
        self.registry = registry = CollectorRegistry()
        self.model_name = model_name
        self.label = (model_name, ENGINE)
        tokens = build_1_2_5_buckets(max_model_len)

        def histogram(name: str, doc: str, buckets: tuple) -> Histogram:
            """Labelled per observation: `engine` is the replica that ran the request."""
            return Histogram(
                name, doc, ["model_name", "engine"], buckets=buckets, registry=registry
            )

        self.request_success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests (each of n completions).",
            ["model_name", "engine", "finished_reason"],
            registry=registry,
        )
        self.time_to_first_token = histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TTFT_BUCKETS,
        )
        self.time_per_output_token = histogram(
            "vllm:time_per_output_token_seconds",
            "Histogram of time per output token in seconds.",
            TPOT_BUCKETS,
        )
        self.inter_token_latency = histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds (an output of several tokens "
            "counts its time once per token).",
            TPOT_BUCKETS,
        )
        self.e2e_request_latency = histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.phases = [
            (
                histogram(
                    name,
                    f"Histogram of time spent in {phase} phase for request.",
                    REQUEST_LATENCY_BUCKETS,
                ),
                start,
                end,
            )
            for name, phase, start, end in PHASES
        ]
        self.request_prompt_tokens = histogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", tokens
        )
        self.request_generation_tokens = histogram(
            "vllm:request_generation_tokens",
            "Number of generation tokens processed (each of n completions).",
            tokens,
        )
        self.request_max_num_generation_tokens = histogram(
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            tokens,
        )
        self.request_params_n = histogram(
            "vllm:request_params_n", "Histogram of the n request parameter.", N_BUCKETS
        )
        self.request_params_max_tokens = histogram(
            "vllm:request_params_max_tokens",
            "Histogram of the max_tokens request parameter.",
            tokens,
        )
        registry.register(EngineStatsCollector(read_stats, self.label, cache_config))
        for engine in range(max(1, len(read_stats()))):  # every series exists at 0, as vLLM's
            self._create_series((model_name, str(engine)))

    def _create_series(self, labels: tuple[str, str]) -> None:
        histograms = [m for m in vars(self).values() if isinstance(m, Histogram)]
        for histogram in histograms + [h for h, _, _ in self.phases]:
            histogram.labels(*labels)
        for reason in FINISHED_REASONS:
            self.request_success.labels(*labels, reason)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    async def track(
        self, outputs: AsyncIterator[RequestOutput], arrival_time: float, params: SamplingParams
    ) -> AsyncIterator[RequestOutput]:
        """Pass a request's DELTA outputs through, observing its latencies; closing this
        iterator closes `outputs` (which aborts the request): its completions count as
        successes then, those unfinished as "abort", as vLLM counts a request its client
        gave up on (each of n as it ends)."""
        first_token_time, last_token_time = None, None
        tokens: defaultdict[int, int] = defaultdict(int)  # per completion index
        labels = (self.model_name, ENGINE)  # until an output names its replica
        ended: dict[int, str] | None = {}  # completion index -> finish reason
        try:
            async with aclosing(outputs):
                async for output in outputs:
                    now = time.monotonic()
                    new_tokens = 0
                    for completion in output.outputs:
                        tokens[completion.index] += len(completion.token_ids)
                        new_tokens += len(completion.token_ids)
                        if completion.finish_reason is not None:
                            ended[completion.index] = completion.finish_reason
                    labels = self._labels(output)
                    if new_tokens and first_token_time is None:
                        first_token_time = now
                        self.time_to_first_token.labels(*labels).observe(now - arrival_time)
                    elif new_tokens:
                        gap = (now - last_token_time) / new_tokens
                        for _ in range(new_tokens):
                            self.inter_token_latency.labels(*labels).observe(gap)
                    if new_tokens:
                        last_token_time = now
                    if output.finished:
                        ended = None  # counted by _observe_finished
                        self._observe_finished(output, now - arrival_time, first_token_time, tokens)
                        self._observe_params(labels, params)
                    yield output
        except (GeneratorExit, asyncio.CancelledError):
            if ended is not None:
                for index in range(params.n):
                    self.request_success.labels(*labels, ended.get(index, "abort")).inc()
            raise

    async def track_pooling(
        self, outputs: AsyncIterator[PoolingRequestOutput], arrival_time: float
    ) -> AsyncIterator[PoolingRequestOutput]:
        """A pooling request's one output, passed through: counted as a finished request
        ("stop") with its prompt tokens, e2e latency and engine phases; closed before it (its
        client gone), counted as "abort", as `track` counts an unfinished completion."""
        finished = False
        try:
            async with aclosing(outputs):
                async for output in outputs:
                    if output.finished:
                        finished = True
                        labels = self._labels(output)
                        latency = time.monotonic() - arrival_time
                        self.e2e_request_latency.labels(*labels).observe(latency)
                        tokens = len(output.prompt_token_ids)
                        self.request_prompt_tokens.labels(*labels).observe(tokens)
                        self.request_success.labels(*labels, "stop").inc()
                        self._observe_phases(labels, output.metrics)
                    yield output
        except (GeneratorExit, asyncio.CancelledError):
            if not finished:
                self.request_success.labels(self.model_name, ENGINE, "abort").inc()
            raise

    def _observe_finished(
        self,
        output: RequestOutput,
        latency: float,
        first_token_time: float | None,
        tokens: dict[int, int],
    ) -> None:
        """TPOT spans the longest completion: (now - first token) / (its tokens - 1)."""
        labels = self._labels(output)
        self.e2e_request_latency.labels(*labels).observe(latency)
        self.request_prompt_tokens.labels(*labels).observe(len(output.prompt_token_ids or ()))
        for n in tokens.values() or (0,):
            self.request_generation_tokens.labels(*labels).observe(n)
        longest = max(tokens.values(), default=0)
        self.request_max_num_generation_tokens.labels(*labels).observe(longest)
        if first_token_time is not None and longest > 1:
            decode_time = time.monotonic() - first_token_time
            self.time_per_output_token.labels(*labels).observe(decode_time / (longest - 1))
        for completion in output.outputs:
            self.request_success.labels(*labels, completion.finish_reason).inc()
        self._observe_phases(labels, output.metrics)

    def _labels(self, output: RequestOutput | PoolingRequestOutput) -> tuple[str, str]:
        """(model_name, engine): the replica that ran the request, as vLLM labels it."""
        return self.model_name, str(output.engine_index)

    def _observe_params(self, labels: tuple[str, str], params: SamplingParams) -> None:
        self.request_params_n.labels(*labels).observe(params.n)
        if params.max_tokens is not None:
            self.request_params_max_tokens.labels(*labels).observe(params.max_tokens)

    def _observe_phases(self, labels: tuple[str, str], times: dict[str, float]) -> None:
        """Each phase whose two timestamps the request reached."""
        for histogram, start, end in self.phases:
            if start in times and end in times:
                histogram.labels(*labels).observe(times[end] - times[start])
