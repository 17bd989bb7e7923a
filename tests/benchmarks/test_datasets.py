"""pagedllm/benchmarks/datasets.py: ranges parse as documented; requests are seeded and in range."""

import pytest

from pagedllm.benchmarks.datasets import max_total_len, parse_len_range, random_requests


def test_parse_len_range() -> None:
    assert parse_len_range("32:512", "--input-len") == (32, 512)
    assert parse_len_range("128", "--input-len") == (128, 128)


@pytest.mark.parametrize("text", ["0:5", "9:3", "a:b", "1:2:3", "", "-4"])
def test_parse_len_range_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="--output-len"):
        parse_len_range(text, "--output-len")


def test_random_requests_are_seeded_and_within_ranges() -> None:
    requests = random_requests(50, (3, 9), (2, 5), vocab_size=320, seed=7)
    assert requests == random_requests(50, (3, 9), (2, 5), vocab_size=320, seed=7)
    assert requests != random_requests(50, (3, 9), (2, 5), vocab_size=320, seed=8)
    assert {r.prompt_len for r in requests} == set(range(3, 10))
    assert {r.output_len for r in requests} == set(range(2, 6))
    assert all(16 <= t < 320 for r in requests for t in r.prompt_token_ids)
    assert max_total_len(requests) == max(r.prompt_len + r.output_len for r in requests)


def test_random_requests_rejects_zero_prompts() -> None:
    with pytest.raises(ValueError, match="num_prompts 0"):
        random_requests(0, (1, 1), (1, 1), vocab_size=10)
