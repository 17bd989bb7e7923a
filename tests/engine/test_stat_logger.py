"""vLLM's periodic stats line (pagedllm/engine/stat_logger.py). Reference: the averages
computed by hand from two snapshots (token deltas / seconds), and vLLM's LoggingStatLogger
line format and idle rule (INFO while an engine made tokens in this interval or the last)."""

import logging

import pytest

from pagedllm.engine.stat_logger import (
    DEFAULT_LOG_STATS_INTERVAL_S,
    IntervalStats,
    LoggingStatLogger,
    format_line,
    kv_cache_label,
    log_stats_interval,
)
from pagedllm.engine.stats import EngineStats, SpecDecodingStats

LOGGER = "pagedllm.engine.stat_logger"


def snapshot(prompt: int = 0, generated: int = 0, **fields: float) -> EngineStats:
    values = dict(
        num_running=0,
        num_waiting=0,
        num_preemptions=0,
        kv_cache_usage=0.0,
        num_free_blocks=100,
        num_blocks=100,
        prefix_cache_queries=0,
        prefix_cache_hits=0,
    )
    tokens = dict(num_prompt_tokens=prompt, num_generation_tokens=generated)
    return EngineStats(**(values | fields | tokens))


BEFORE = snapshot(100, 50, num_preemptions=1, prefix_cache_queries=40, prefix_cache_hits=10)
AFTER = snapshot(
    500,
    250,
    num_running=3,
    num_waiting=2,
    num_preemptions=3,
    kv_cache_usage=0.123,
    prefix_cache_queries=400,
    prefix_cache_hits=100,
)


def test_interval_averages_are_token_deltas_over_seconds() -> None:
    s = IntervalStats.between(BEFORE, AFTER, seconds=8.0)
    assert s.prompt_throughput == (500 - 100) / 8  # 50 tokens/s
    assert s.generation_throughput == (250 - 50) / 8  # 25 tokens/s
    assert (s.num_running, s.num_waiting, s.num_preemptions) == (3, 2, 3 - 1)
    assert s.kv_cache_usage == 0.123
    assert s.prefix_cache_hit_rate == 100 / 400  # since the start, as the counters are


def test_no_time_passed_is_no_throughput() -> None:
    s = IntervalStats.between(BEFORE, AFTER, seconds=0.0)
    assert (s.prompt_throughput, s.generation_throughput) == (0.0, 0.0)


def test_line_is_vllms_format() -> None:
    s = IntervalStats.between(BEFORE, AFTER, seconds=8.0)
    assert format_line(0, s) == (
        "Engine 000: Avg prompt throughput: 50.0 tokens/s, "
        "Avg generation throughput: 25.0 tokens/s, Running: 3 reqs, Waiting: 2 reqs, "
        "Preemptions: 2, KV cache usage: 12.3%, Prefix cache hit rate: 25.0%"
    )


def test_line_without_preemptions_and_on_a_gpu() -> None:
    after = snapshot(130, 60, num_running=1, kv_cache_usage=0.5)
    s = IntervalStats.between(snapshot(100, 50), after, seconds=3.0)
    assert format_line(12, s, kv_cache_label("cuda:0")) == (
        "Engine 012: Avg prompt throughput: 10.0 tokens/s, "
        "Avg generation throughput: 3.3 tokens/s, Running: 1 reqs, Waiting: 0 reqs, "
        "GPU KV cache usage: 50.0%, Prefix cache hit rate: 0.0%"
    )


def test_line_ends_with_the_intervals_draft_acceptance() -> None:
    """vLLM's SpecDecoding figures of the interval: 1 + accepted / drafts verified, and
    accepted / drafted tokens; none in an interval without drafts."""
    before = snapshot(spec_decoding=SpecDecodingStats(10, 40, 20))
    after = snapshot(spec_decoding=SpecDecodingStats(30, 120, 50))
    line = format_line(0, IntervalStats.between(before, after, seconds=1.0))
    assert line.endswith(
        "Prefix cache hit rate: 0.0%, Mean acceptance length: 2.50, Draft acceptance rate: 37.5%"
    )
    idle = format_line(0, IntervalStats.between(after, after, seconds=1.0))
    assert idle.endswith("Prefix cache hit rate: 0.0%")


def test_kv_cache_label_by_device() -> None:
    assert kv_cache_label("cpu") == "KV cache usage"
    assert kv_cache_label("cuda") == "GPU KV cache usage"


def logged(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == LOGGER]
    caplog.clear()
    return lines


def test_idle_intervals_log_at_debug_only(caplog: pytest.LogCaptureFixture) -> None:
    stat_logger = LoggingStatLogger([snapshot()], 10.0, now=0.0)
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        stat_logger.log([snapshot()], now=10.0)
        assert [level for level, _ in logged(caplog)] == [logging.DEBUG]
        stat_logger.log([snapshot(20, 10)], now=20.0)  # busy: INFO
        assert logged(caplog) == [
            (
                logging.INFO,
                "Engine 000: Avg prompt throughput: 2.0 tokens/s, Avg generation throughput: "
                "1.0 tokens/s, Running: 0 reqs, Waiting: 0 reqs, KV cache usage: 0.0%, "
                "Prefix cache hit rate: 0.0%",
            )
        ]
        stat_logger.log([snapshot(20, 10)], now=30.0)  # the fall to 0 is shown
        assert [level for level, _ in logged(caplog)] == [logging.INFO]
        stat_logger.log([snapshot(20, 10)], now=40.0)
        assert [level for level, _ in logged(caplog)] == [logging.DEBUG]


def test_each_data_parallel_engine_logs_its_own_line(caplog: pytest.LogCaptureFixture) -> None:
    stat_logger = LoggingStatLogger([snapshot(), snapshot()], 10.0, now=0.0)
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        stat_logger.log([snapshot(50, 20, num_running=2), snapshot()], now=5.0)
    (level0, line0), (level1, line1) = logged(caplog)
    assert level0 == logging.INFO and line0.startswith("Engine 000: Avg prompt throughput: 10.0")
    assert "Running: 2 reqs" in line0
    assert level1 == logging.DEBUG and line1.startswith("Engine 001: Avg prompt throughput: 0.0")


def test_due_once_the_interval_has_passed_since_the_last_line() -> None:
    stat_logger = LoggingStatLogger([snapshot()], 10.0, now=0.0)
    assert not stat_logger.due(now=9.9)
    assert stat_logger.due(now=10.0)
    stat_logger.log([snapshot()], now=10.5)
    assert not stat_logger.due(now=20.0) and stat_logger.due(now=20.5)


def test_interval_env_pagedllm_first_then_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PAGEDLLM_LOG_STATS_INTERVAL", raising=False)
    monkeypatch.delenv("VLLM_LOG_STATS_INTERVAL", raising=False)
    assert log_stats_interval() == DEFAULT_LOG_STATS_INTERVAL_S == 10.0
    monkeypatch.setenv("VLLM_LOG_STATS_INTERVAL", "2.5")
    assert log_stats_interval() == 2.5
    monkeypatch.setenv("PAGEDLLM_LOG_STATS_INTERVAL", "0.2")
    assert log_stats_interval() == 0.2


@pytest.mark.parametrize("value", ["soon", "0", "-1", "inf", "nan"])
def test_bad_interval_names_the_variable(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("PAGEDLLM_LOG_STATS_INTERVAL", value)
    with pytest.raises(ValueError, match=f"PAGEDLLM_LOG_STATS_INTERVAL={value!r} must be"):
        log_stats_interval()
