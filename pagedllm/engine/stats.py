"""EngineStats: a snapshot of the engine's load and counters, for metrics."""

from dataclasses import dataclass

from pagedllm.core.scheduler import Scheduler


@dataclass
class EngineStats:
    """Token counts: prompt tokens of requests that got their first token, and every
    generated token (each of n completions). Waiting counts the requests whose grammar is
    still compiling too."""

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

    @classmethod
    def of(
        cls,
        scheduler: Scheduler,
        num_prompt_tokens: int,
        num_generation_tokens: int,
        num_waiting_for_grammar: int = 0,
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
        )
