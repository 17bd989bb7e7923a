"""Fixtures shared by the whole suite: a fixed seed, and per-rank layer construction."""

from collections.abc import Callable

import pytest
import torch
from torch import nn

from pagedllm.distributed.parallel_state import override_tensor_parallel


@pytest.fixture(autouse=True)
def _seed() -> None:
    """Every test sees the same random tensors, whatever ran before it."""
    torch.manual_seed(0)


@pytest.fixture
def build_per_rank() -> Callable[[Callable[[], nn.Module], int], list[nn.Module]]:
    """`build_per_rank(factory, tp_size)` -> [rank 0's layer, ..., rank tp_size-1's layer].

    Each layer is built under `override_tensor_parallel`, so no process group is needed.
    Outside the override the process is rank 0 of 1 again and collectives are the
    identity, so a built layer's forward returns that rank's local (unreduced) result.
    """

    def build(factory: Callable[[], nn.Module], tp_size: int) -> list[nn.Module]:
        layers = []
        for rank in range(tp_size):
            with override_tensor_parallel(rank, tp_size):
                layers.append(factory())
        return layers

    return build
