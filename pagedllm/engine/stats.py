"""EngineStats: a snapshot of the engine's load and counters, for metrics; the per-step
token histogram it carries; and the timestamps a finished request's output reports."""

from bisect import bisect_left
from dataclasses import dataclass, field, replace

from pagedllm.core.scheduler import Scheduler

ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
"""vLLM's buckets for vllm:iteration_tokens_total (tokens per engine step)."""


@dataclass
class HistogramCounts:
    """Observations counted per bucket (`counts[i]`: values in (buckets[i-1], buckets[i]];
    the last slot is past the last bucket) and summed: what a Prometheus histogram needs,
    kept by the engine thread at the cost of one bisect per observation."""

    buckets: tuple[float, ...]
    counts: list[int]
    sum: float = 0.0

    @classmethod
    def empty(cls, buckets: tuple[float, ...]) -> "HistogramCounts":
        return cls(buckets, [0] * (len(buckets) + 1))

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.buckets, value)] += 1
        self.sum += value

    def copy(self) -> "HistogramCounts":
        return HistogramCounts(self.buckets, list(self.counts), self.sum)


@dataclass
class SpecDecodingStats:
    """Speculative decoding's counters since the engine started (vLLM's
    vllm:spec_decode_* metrics): verifications of a sequence's drafts (`num_drafts`), the
    draft tokens verified, those accepted, and those accepted at each draft position (the
    first draft token, the second, ...; a draft is accepted up to its first rejection)."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)

    def observe(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted_tokens
        per_pos = self.num_accepted_tokens_per_pos
        per_pos += [0] * (num_draft_tokens - len(per_pos))
        for pos in range(num_accepted_tokens):
            per_pos[pos] += 1

    def copy(self) -> "SpecDecodingStats":
        return replace(self, num_accepted_tokens_per_pos=list(self.num_accepted_tokens_per_pos))


@dataclass
class LoRAStats:
    """vLLM's lora_requests_info: the adapters (names) running and waiting requests use,
    and the most the engine runs at once."""

    max_lora: int
    running: list[str]
    waiting: list[str]

    @classmethod
    def of(cls, scheduler: Scheduler, max_lora: int) -> "LoRAStats":
        def names(seqs: object) -> list[str]:
            return sorted({s.lora_request.lora_name for s in seqs if s.lora_request is not None})

        return cls(max_lora, names(scheduler.running), names(scheduler.waiting))


def _no_iterations() -> HistogramCounts:
    return HistogramCounts.empty(ITERATION_TOKENS_BUCKETS)


@dataclass
class EngineStats:
    """Token counts: prompt tokens of requests that got their first token (or, pooling,
    were pooled), and every generated token (each of n completions). Waiting counts the
    requests whose grammar is still compiling too. `iteration_tokens`: the tokens each
    step ran (prefill chunks plus decodes). `spec_decoding`: None unless the engine runs
    speculative decoding; `lora`, unless LoRA is on."""

    num_running: int
    num_waiting: int
    num_preemptions: int
    kv_cache_usage: float
    num_free_blocks: int
    num_blocks: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    num_prompt_tokens: int
    num_generation_tokens: int
    iteration_tokens: HistogramCounts = field(default_factory=_no_iterations)
    spec_decoding: SpecDecodingStats | None = None
    lora: LoRAStats | None = None

    @classmethod
    def of(
        cls,
        scheduler: Scheduler,
        num_prompt_tokens: int,
        num_generation_tokens: int,
        num_waiting_for_grammar: int = 0,
        iteration_tokens: HistogramCounts | None = None,
        spec_decoding: SpecDecodingStats | None = None,
        lora: LoRAStats | None = None,
    ) -> "EngineStats":
        blocks = scheduler.block_manager
        return cls(
            num_running=scheduler.num_running,
            num_waiting=scheduler.num_waiting + num_waiting_for_grammar,
            num_preemptions=scheduler.num_preemptions,
            kv_cache_usage=blocks.usage,
            num_free_blocks=blocks.num_free_blocks,
            num_blocks=blocks.num_blocks,
            prefix_cache_queries=blocks.prefix_cache_queries,
            prefix_cache_hits=blocks.prefix_cache_hits,
            num_prompt_tokens=num_prompt_tokens,
            num_generation_tokens=num_generation_tokens,
            iteration_tokens=(iteration_tokens or _no_iterations()).copy(),
            spec_decoding=None if spec_decoding is None else spec_decoding.copy(),
            lora=lora,
        )


def request_metrics(
    arrival_time: float,
    first_scheduled_time: float | None,
    first_token_time: float | None,
    last_token_time: float | None,
) -> dict[str, float]:
    """A finished request's RequestOutput.metrics: vLLM's request timestamps (seconds of
    time.monotonic), those the request reached. The server derives vLLM's phases from
    them: queue = first scheduled - arrival, prefill = first token - first scheduled,
    decode = last token - first token, inference = last token - first scheduled."""
    times = {
        "arrival_time": arrival_time,
        "first_scheduled_time": first_scheduled_time,
        "first_token_time": first_token_time,
        "last_token_time": last_token_time,
    }
    return {name: t for name, t in times.items() if t is not None}
