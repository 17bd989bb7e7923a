"""The /metrics families read from the engine's latest EngineStats snapshot at scrape
time (vLLM's names and types; `pagedllm:` where vLLM has no such metric), and
vllm:cache_config_info, the KV cache's configuration as labels of a gauge set to 1."""

import dataclasses
from collections.abc import Callable, Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from pagedllm.config import CacheConfig
from pagedllm.engine.stats import EngineStats, HistogramCounts

LABELS = ["model_name", "engine"]


class EngineStatsCollector(Collector):
    def __init__(
        self,
        read_stats: Callable[[], EngineStats],
        label: tuple[str, str],
        cache_config: CacheConfig,
    ) -> None:
        """`label`: the (model_name, engine) values of every family."""
        self.read_stats = read_stats
        self.label = list(label)
        self.cache_config = cache_config

    def collect(self) -> Iterator[Metric]:
        s = self.read_stats()
        for kind, name, doc, value in _rows(s):
            family = kind(name, doc, labels=LABELS)
            family.add_metric(self.label, value)
            yield family
        yield self._histogram(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            s.iteration_tokens,
        )
        yield self._cache_config_info(s.num_blocks)

    def _histogram(self, name: str, doc: str, counts: HistogramCounts) -> Metric:
        family = HistogramMetricFamily(name, doc, labels=LABELS)
        cumulative, buckets = 0, []
        for bound, count in zip([*map(floatToGoString, counts.buckets), "+Inf"], counts.counts):
            cumulative += count
            buckets.append((bound, cumulative))
        family.add_metric(self.label, buckets, counts.sum)
        return family

    def _cache_config_info(self, num_blocks: int) -> Metric:
        """vLLM's info gauge: the cache config's fields, and the blocks the cache holds as
        `num_gpu_blocks` (vLLM's name, which routers read for the KV capacity)."""
        info = {
            f.name: str(getattr(self.cache_config, f.name)) for f in dataclasses.fields(CacheConfig)
        }
        info |= {"num_gpu_blocks": str(num_blocks), "engine": self.label[1]}
        family = GaugeMetricFamily(
            "vllm:cache_config_info", "Information of the LLMEngine CacheConfig", labels=list(info)
        )
        family.add_metric(list(info.values()), 1)
        return family


def _rows(s: EngineStats) -> list[tuple[type, str, str, float]]:
    gauge, counter = GaugeMetricFamily, CounterMetricFamily
    hit_rate = s.prefix_cache_hits / s.prefix_cache_queries if s.prefix_cache_queries else 0
    return [
        (gauge, "vllm:num_requests_running", "Sequences in the running batch.", s.num_running),
        (gauge, "vllm:num_requests_waiting", "Sequences waiting to run.", s.num_waiting),
        (gauge, "vllm:kv_cache_usage_perc", "Fraction of KV blocks in use.", s.kv_cache_usage),
        (
            gauge,
            "pagedllm:kv_cache_blocks_in_use",
            "KV blocks in use.",
            s.num_blocks - s.num_free_blocks,
        ),
        (gauge, "pagedllm:kv_cache_blocks_total", "KV blocks in the cache.", s.num_blocks),
        (
            gauge,
            "pagedllm:prefix_cache_hit_rate",
            "Prompt tokens found cached / looked up.",
            hit_rate,
        ),
        (counter, "vllm:prefix_cache_queries", "Prompt tokens looked up.", s.prefix_cache_queries),
        (counter, "vllm:prefix_cache_hits", "Prompt tokens found cached.", s.prefix_cache_hits),
        (
            counter,
            "vllm:num_preemptions",
            "Cumulative number of preemption from the engine.",
            s.num_preemptions,
        ),
        (counter, "vllm:prompt_tokens", "Number of prefill tokens processed.", s.num_prompt_tokens),
        (
            counter,
            "vllm:generation_tokens",
            "Number of generation tokens processed.",
            s.num_generation_tokens,
        ),
    ]
