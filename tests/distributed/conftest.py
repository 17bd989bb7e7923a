"""A gloo process group of one rank, in this process, for the tests of pagedllm/distributed."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from pagedllm.distributed.parallel_state import (
    destroy_distributed_environment,
    init_distributed_environment,
)


@pytest.fixture
def gloo_group_of_one(tmp_path: Path) -> Iterator[None]:
    init_distributed_environment(1, 0, init_method=f"file://{tmp_path / 'rendezvous'}")
    try:
        yield
    finally:
        destroy_distributed_environment()
