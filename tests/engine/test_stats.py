"""EngineStats (pagedllm/engine/stats.py). Reference: its definition: the scheduler's queue
lengths and preemptions, the block manager's usage, free blocks and prefix-cache counters, and
the token counts the engine passes (prompt tokens of requests that got their first token,
every generated token)."""

from types import SimpleNamespace

from pagedllm.engine.stats import EngineStats
from tests.engine.engine_helpers import LLAMA, Run, greedy, make_engine, run_all, step_once


def test_of_reads_each_field_from_the_scheduler_and_block_manager() -> None:
    """Every source value distinct, so a field read from the wrong place shows."""
    blocks = SimpleNamespace(
        usage=0.25, num_free_blocks=30, num_blocks=40, prefix_cache_queries=7, prefix_cache_hits=5
    )
    scheduler = SimpleNamespace(
        num_running=3, num_waiting=2, num_preemptions=1, block_manager=blocks
    )
    stats = EngineStats.of(scheduler, num_prompt_tokens=100, num_generation_tokens=9)
    assert stats == EngineStats(
        num_running=3,
        num_waiting=2,
        num_preemptions=1,
        kv_cache_usage=0.25,
        num_free_blocks=30,
        num_blocks=40,
        prefix_cache_queries=7,
        prefix_cache_hits=5,
        num_prompt_tokens=100,
        num_generation_tokens=9,
    )


def test_stats_count_tokens(tiny_model_path, spread_prompts) -> None:
    engine = make_engine(tiny_model_path(LLAMA), num_kv_blocks=40)
    engine.add_request("a", {"prompt_token_ids": spread_prompts[2]}, greedy(5))
    engine.add_request("b", {"prompt_token_ids": spread_prompts[3]}, greedy(3))
    step_once(engine, Run())
    stats = engine.get_stats()
    assert (stats.num_running, stats.num_waiting) == (2, 0)
    assert 0 < stats.kv_cache_usage < 1
    run_all(engine)
    stats = engine.get_stats()
    assert stats.num_prompt_tokens == 23 + 47
    assert stats.num_generation_tokens == 5 + 3
    assert (stats.num_running, stats.num_free_blocks, stats.num_blocks) == (0, 40, 40)
