"""pagedllm/benchmarks/bandwidth.py: the bound is bandwidth / weight bytes (formula)."""

import pytest
import torch
from torch import nn

from pagedllm.benchmarks.bandwidth import (
    decode_bound_tokens_per_s,
    measure_read_bandwidth,
    weight_bytes,
)


def test_measure_read_bandwidth_is_positive() -> None:
    assert measure_read_bandwidth(8 * 1024**2, repeats=2) > 0


def test_measure_read_bandwidth_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError, match="num_bytes 0"):
        measure_read_bandwidth(0)


def test_weight_bytes_counts_tied_weights_once() -> None:
    embed = nn.Embedding(10, 4)
    head = nn.Linear(4, 10, bias=False)
    head.weight = embed.weight
    model = nn.ModuleList([embed, head, nn.Linear(4, 4, dtype=torch.float16)])
    assert weight_bytes(model) == 10 * 4 * 4 + (16 + 4) * 2


def test_decode_bound() -> None:
    assert decode_bound_tokens_per_s(20e9, 500_000_000) == 40.0
    assert decode_bound_tokens_per_s(20e9, 500_000_000, batch_size=4) == 160.0
