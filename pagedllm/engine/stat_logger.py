"""vLLM's LoggingStatLogger: a line per engine replica, every log-stats interval, of the
token throughputs since the last line and the current load, from two EngineStats
snapshots:

    Engine 000: Avg prompt throughput: 40.0 tokens/s, Avg generation throughput: 12.5
    tokens/s, Running: 3 reqs, Waiting: 0 reqs, KV cache usage: 4.7%, Prefix cache hit
    rate: 25.0%

(one line in the log). `Preemptions: N` (in the interval) comes before the KV cache
usage when N > 0; under speculative decoding, an interval that verified drafts ends with
their acceptance (vLLM's SpecDecoding metrics: `Mean acceptance length: 2.50, Draft
acceptance rate: 37.5%`: tokens a verification appends on average, accepted / drafted
tokens); the usage is "GPU KV cache usage" on CUDA, as vLLM names it. The
prefix cache hit rate is of every prompt token looked up since the engine started
(vLLM's: of its last 1000 requests'). A line goes to pagedllm's logger at INFO when an
engine made tokens in this interval or the last one (so the line that shows them falling
to 0 is seen), at DEBUG otherwise: an idle server shows nothing, as vLLM's.
"""

import logging
import time
from dataclasses import dataclass

from pagedllm.engine.stats import EngineStats
from pagedllm.logger import init_logger
from pagedllm.value_checks import env_number

logger = init_logger(__name__)

LOG_STATS_INTERVAL_ENVS = ("PAGEDLLM_LOG_STATS_INTERVAL", "VLLM_LOG_STATS_INTERVAL")
DEFAULT_LOG_STATS_INTERVAL_S = 10.0


def log_stats_interval() -> float:
    """Seconds between lines: the first of LOG_STATS_INTERVAL_ENVS set, else vLLM's 10."""
    for name in LOG_STATS_INTERVAL_ENVS:
        seconds = env_number(name, "seconds", positive=True)
        if seconds is not None:
            return seconds
    return DEFAULT_LOG_STATS_INTERVAL_S


def kv_cache_label(device: str) -> str:
    """vLLM's "GPU KV cache usage" where the cache is on a GPU."""
    return "GPU KV cache usage" if device.startswith("cuda") else "KV cache usage"


@dataclass(frozen=True)
class IntervalStats:
    """One engine's figures for one line: throughputs in tokens/s over the interval,
    preemptions in it, and the load at its end."""

    prompt_throughput: float
    generation_throughput: float
    num_running: int
    num_waiting: int
    num_preemptions: int
    kv_cache_usage: float
    prefix_cache_hit_rate: float
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0

    @classmethod
    def between(cls, before: EngineStats, after: EngineStats, seconds: float) -> "IntervalStats":
        def rate(tokens: int) -> float:
            return tokens / seconds if seconds > 0 else 0.0

        queries = after.prefix_cache_queries
        drafts = (0, 0, 0)
        if after.spec_decoding is not None and before.spec_decoding is not None:
            a, b = after.spec_decoding, before.spec_decoding
            drafts = (
                a.num_drafts - b.num_drafts,
                a.num_draft_tokens - b.num_draft_tokens,
                a.num_accepted_tokens - b.num_accepted_tokens,
            )
        return cls(
            prompt_throughput=rate(after.num_prompt_tokens - before.num_prompt_tokens),
            generation_throughput=rate(after.num_generation_tokens - before.num_generation_tokens),
            num_running=after.num_running,
            num_waiting=after.num_waiting,
            num_preemptions=after.num_preemptions - before.num_preemptions,
            kv_cache_usage=after.kv_cache_usage,
            prefix_cache_hit_rate=after.prefix_cache_hits / queries if queries else 0.0,
            num_drafts=drafts[0],
            num_draft_tokens=drafts[1],
            num_accepted_tokens=drafts[2],
        )

    @property
    def made_tokens(self) -> bool:
        return self.prompt_throughput > 0 or self.generation_throughput > 0


def format_line(engine_index: int, s: IntervalStats, kv_label: str = "KV cache usage") -> str:
    parts = [
        f"Avg prompt throughput: {s.prompt_throughput:.1f} tokens/s",
        f"Avg generation throughput: {s.generation_throughput:.1f} tokens/s",
        f"Running: {s.num_running} reqs",
        f"Waiting: {s.num_waiting} reqs",
    ]
    if s.num_preemptions > 0:
        parts.append(f"Preemptions: {s.num_preemptions}")
    parts.append(f"{kv_label}: {s.kv_cache_usage * 100:.1f}%")
    parts.append(f"Prefix cache hit rate: {s.prefix_cache_hit_rate * 100:.1f}%")
    if s.num_draft_tokens > 0:
        length = 1 + s.num_accepted_tokens / s.num_drafts
        parts.append(f"Mean acceptance length: {length:.2f}")
        parts.append(f"Draft acceptance rate: {s.num_accepted_tokens / s.num_draft_tokens:.1%}")
    return f"Engine {engine_index:03d}: " + ", ".join(parts)


class LoggingStatLogger:
    """Logs each engine's line against the snapshots it logged last (or started from)."""

    def __init__(
        self,
        stats_per_engine: list[EngineStats],
        interval_s: float,
        kv_label: str = "KV cache usage",
        now: float | None = None,
    ) -> None:
        self.interval_s = interval_s
        self.kv_label = kv_label
        self.last_stats = list(stats_per_engine)
        self.last_log_time = time.monotonic() if now is None else now
        self.made_tokens = [False] * len(self.last_stats)

    def log(self, stats_per_engine: list[EngineStats], now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        seconds = now - self.last_log_time
        made_tokens = []
        pairs = zip(self.last_stats, stats_per_engine, self.made_tokens)
        for index, (before, after, was_busy) in enumerate(pairs):
            interval = IntervalStats.between(before, after, seconds)
            level = logging.INFO if interval.made_tokens or was_busy else logging.DEBUG
            logger.log(level, "%s", format_line(index, interval, self.kv_label))
            made_tokens.append(interval.made_tokens)
        self.last_stats, self.last_log_time = list(stats_per_engine), now
        self.made_tokens = made_tokens

    def due(self, now: float | None = None) -> bool:
        """interval_s has passed since the last line: for a caller that steps the engine
        itself (the offline LLM), which then takes the snapshots only when they are due."""
        now = time.monotonic() if now is None else now
        return now - self.last_log_time >= self.interval_s
