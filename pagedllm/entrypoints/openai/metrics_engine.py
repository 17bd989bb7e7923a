"""The /metrics families read from the engine's latest EngineStats snapshot at scrape
time (vLLM's names and types; `pagedllm:` where vLLM has no such metric), and
vllm:cache_config_info, the KV cache's configuration as labels of a gauge set to 1."""

import dataclasses
import time
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
from pagedllm.engine.stats import EngineStats, HistogramCounts, LoRAStats, SpecDecodingStats

LABELS = ["model_name", "engine"]


class EngineStatsCollector(Collector):
    def __init__(
        self,
        read_stats: Callable[[], list[EngineStats]],
        label: tuple[str, str],
        cache_config: CacheConfig,
    ) -> None:
        """`read_stats`: each engine replica's latest stats, labelled engine="0", "1", ...
        by position (one without data parallelism); `label`: the model_name value of
        every family (its engine value is the position's)."""
        self.read_stats = read_stats
        self.model_name = label[0]
        self.cache_config = cache_config

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        iterations = HistogramMetricFamily(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            labels=LABELS,
        )
        info: Metric | None = None
        per_pos: Metric | None = None
        lora_info: Metric | None = None
        for engine, s in enumerate(self.read_stats()):
            label = [self.model_name, str(engine)]
            for kind, name, doc, value in _rows(s):
                if name not in families:
                    families[name] = kind(name, doc, labels=LABELS)
                families[name].add_metric(label, value)
            _add_histogram(iterations, label, s.iteration_tokens)
            if s.spec_decoding is not None:
                per_pos = per_pos or CounterMetricFamily(
                    "vllm:spec_decode_num_accepted_tokens_per_pos",
                    "Accepted tokens per draft position.",
                    labels=[*LABELS, "position"],
                )
                for pos, count in enumerate(s.spec_decoding.num_accepted_tokens_per_pos):
                    per_pos.add_metric([*label, str(pos)], count)
            info = self._add_cache_config_info(info, str(engine), s.num_blocks)
            if s.lora is not None:
                lora_info = _add_lora_info(lora_info, str(engine), s.lora)
        yield from families.values()
        yield iterations
        if per_pos is not None:
            yield per_pos
        if info is not None:
            yield info
        if lora_info is not None:
            yield lora_info

    def _add_cache_config_info(self, family: Metric | None, engine: str, blocks: int) -> Metric:
        """vLLM's info gauge: the cache config's fields, and the blocks the cache holds as
        `num_gpu_blocks` (vLLM's name, which routers read for the KV capacity)."""
        info = {
            f.name: str(getattr(self.cache_config, f.name)) for f in dataclasses.fields(CacheConfig)
        }
        info |= {"num_gpu_blocks": str(blocks), "engine": engine}
        if family is None:
            family = GaugeMetricFamily(
                "vllm:cache_config_info",
                "Information of the LLMEngine CacheConfig",
                labels=list(info),
            )
        family.add_metric(list(info.values()), 1)
        return family


def _add_lora_info(family: Metric | None, engine: str, lora: LoRAStats) -> Metric:
    """vLLM's vllm:lora_requests_info: the adapters in use (names joined by commas) as
    labels of a gauge set to the time of the scrape."""
    if family is None:
        family = GaugeMetricFamily(
            "vllm:lora_requests_info",
            "Running stats on lora requests.",
            labels=["max_lora", "waiting_lora_adapters", "running_lora_adapters", "engine"],
        )
    labels = [str(lora.max_lora), ",".join(lora.waiting), ",".join(lora.running), engine]
    family.add_metric(labels, time.time())
    return family


def _add_histogram(family: Metric, label: list[str], counts: HistogramCounts) -> None:
    cumulative, buckets = 0, []
    for bound, count in zip([*map(floatToGoString, counts.buckets), "+Inf"], counts.counts):
        cumulative += count
        buckets.append((bound, cumulative))
    family.add_metric(label, buckets, counts.sum)


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
        *_spec_decoding_rows(s.spec_decoding),
    ]


def _spec_decoding_rows(spec: SpecDecodingStats | None) -> list[tuple[type, str, str, float]]:
    """vLLM's speculative decoding counters, where the engine runs it."""
    if spec is None:
        return []
    counter = CounterMetricFamily
    return [
        (
            counter,
            "vllm:spec_decode_num_drafts",
            "Number of spec decoding drafts.",
            spec.num_drafts,
        ),
        (
            counter,
            "vllm:spec_decode_num_draft_tokens",
            "Number of draft tokens.",
            spec.num_draft_tokens,
        ),
        (
            counter,
            "vllm:spec_decode_num_accepted_tokens",
            "Number of accepted tokens.",
            spec.num_accepted_tokens,
        ),
    ]
