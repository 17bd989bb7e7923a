"""pagedllm/distributed/layer_partition.py against vLLM's get_pp_indices: an even split, the
remainder to the stages before the last, and the env override."""

import pytest

from pagedllm.distributed.layer_partition import PARTITION_ENV, get_pp_indices


@pytest.mark.parametrize(
    "layers, size, expected",
    [
        (2, 2, [(0, 1), (1, 2)]),
        (80, 2, [(0, 40), (40, 80)]),
        (5, 2, [(0, 3), (3, 5)]),
        (30, 4, [(0, 7), (7, 15), (15, 23), (23, 30)]),
        (7, 1, [(0, 7)]),
    ],
)
def test_even_split_with_the_remainder_before_the_last(layers, size, expected) -> None:
    assert [get_pp_indices(layers, rank, size) for rank in range(size)] == expected


def test_the_env_override_sets_each_stages_count(monkeypatch) -> None:
    monkeypatch.setenv(PARTITION_ENV, "4,6,6,4")
    assert [get_pp_indices(20, r, 4) for r in range(4)] == [(0, 4), (4, 10), (10, 16), (16, 20)]


@pytest.mark.parametrize(
    "value, message",
    [
        ("4,6", "must give 4 layer counts"),
        ("5,5,5,6", "that add up to the model's 20 layers"),
        ("10,10,0,0", "every stage needs a layer"),
        ("a,b", "is not a comma-separated list of ints"),
    ],
)
def test_a_bad_override_is_an_error(value, message, monkeypatch) -> None:
    monkeypatch.setenv(PARTITION_ENV, value)
    with pytest.raises(ValueError, match=message):
        get_pp_indices(20, 0, 4)


def test_more_stages_than_layers_is_an_error() -> None:
    with pytest.raises(ValueError, match="pipeline_parallel_size 3 is more than the model's 2"):
        get_pp_indices(2, 0, 3)
