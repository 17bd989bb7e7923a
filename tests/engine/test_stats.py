"""EngineStats (pagedllm/engine/stats.py). Reference: its definition: the scheduler's queue
lengths and preemptions, the block manager's usage, free blocks and prefix-cache counters, and
the token counts the engine passes (prompt tokens of requests that got their first token,
every generated token); per step, the tokens it ran (a request computes its prompt and every
generated token but the last); Prometheus' bucket rule (a bucket holds the values <= its
bound); the request timestamps in the order a request reaches them."""

from types import SimpleNamespace

from pagedllm.engine.stats import EngineStats, HistogramCounts, request_metrics
from pagedllm.pooling_params import PoolingParams
from tests.embedding_models import embedding_folder
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


def test_histogram_counts_put_a_value_on_a_bound_in_that_bucket() -> None:
    counts = HistogramCounts.empty((1, 8, 16))
    for value in (0, 1, 2, 8, 16, 17, 1000):
        counts.observe(value)
    assert counts.counts == [2, 2, 1, 2]  # (-inf, 1], (1, 8], (8, 16], (16, +inf)
    assert counts.sum == 1044
    snapshot = counts.copy()
    counts.observe(1)
    assert snapshot.counts == [2, 2, 1, 2], "a snapshot does not move with the engine"


def test_request_metrics_keeps_the_timestamps_reached() -> None:
    assert request_metrics(1.0, None, None, None) == {"arrival_time": 1.0}
    assert request_metrics(1.0, 2.0, 3.0, 4.0) == {
        "arrival_time": 1.0,
        "first_scheduled_time": 2.0,
        "first_token_time": 3.0,
        "last_token_time": 4.0,
    }


def test_iteration_tokens_and_finished_outputs_timestamps(tiny_model_path, spread_prompts) -> None:
    """Prompts of 23 and 47 tokens with 5 and 3 generated: the steps ran 23 + 4 + 47 + 2
    tokens, one observation per step; each finished output has its four timestamps in
    order, unfinished ones none."""
    engine = make_engine(tiny_model_path(LLAMA), num_kv_blocks=40, max_num_batched_tokens=32)
    engine.add_request("a", {"prompt_token_ids": spread_prompts[2]}, greedy(5))
    engine.add_request("b", {"prompt_token_ids": spread_prompts[3]}, greedy(3))
    run = run_all(engine)
    iterations = engine.get_stats().iteration_tokens
    assert iterations.sum == 23 + 4 + 47 + 2
    assert sum(iterations.counts) == run.num_steps
    for request_id in ("a", "b"):
        *running, finished = run.history[request_id]
        assert all(out.metrics == {} for out in running)
        times = finished.metrics
        order = ["arrival_time", "first_scheduled_time", "first_token_time", "last_token_time"]
        assert list(times) == order
        assert sorted(times.values()) == [times[name] for name in order]


def test_pooling_output_reports_its_timestamps_and_prompt_tokens(
    tiny_model_path, tmp_path, spread_prompts
) -> None:
    """A pooling request's one output: its first and last "token" are its pooled vector."""
    folder = embedding_folder(tiny_model_path(LLAMA), str(tmp_path / "embed"))
    engine = make_engine(folder, num_kv_blocks=40, runner="pooling")
    engine.add_request("e", {"prompt_token_ids": spread_prompts[2]}, PoolingParams())
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    (output,) = outputs
    times = output.metrics
    assert times["arrival_time"] <= times["first_scheduled_time"] <= times["first_token_time"]
    assert times["first_token_time"] == times["last_token_time"]
    stats = engine.get_stats()
    assert stats.num_prompt_tokens == 23
    assert stats.iteration_tokens.sum == 23
