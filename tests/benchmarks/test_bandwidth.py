"""pagedllm/benchmarks/bandwidth.py: the bound is bandwidth / weight bytes (formula)."""

import pytest

from pagedllm.benchmarks.bandwidth import decode_bound_tokens_per_s, measure_read_bandwidth


def test_measure_read_bandwidth_is_positive() -> None:
    assert measure_read_bandwidth(8 * 1024**2, repeats=2) > 0


def test_measure_read_bandwidth_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError, match="num_bytes 0"):
        measure_read_bandwidth(0)


def test_decode_bound() -> None:
    assert decode_bound_tokens_per_s(20e9, 500_000_000) == 40.0
    assert decode_bound_tokens_per_s(20e9, 500_000_000, batch_size=4) == 160.0
