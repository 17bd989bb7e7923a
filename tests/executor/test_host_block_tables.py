"""HostBlockTables against the tables built from the lists (batch._block_tables), over
steps of a real BlockManager: appends, forks with copy on write, frees and reallocation,
eviction of stale rows and growth past the first array."""

import torch

from pagedllm.executor.batch import SeqChunk, _block_tables
from pagedllm.executor.host_block_tables import STALE_STEPS, HostBlockTables
from tests.executor.block_manager_steps import random_block_steps


def reference(tables: list[list[int]]) -> torch.Tensor:
    return _block_tables([SeqChunk([0], 0, table) for table in tables])


def test_rows_follow_a_block_manager_through_random_steps() -> None:
    cache = HostBlockTables(num_rows=2, num_cols=2)  # grows in both directions
    for step in random_block_steps(seed=0):
        if step.batch:
            tables = [seq.block_table for seq in step.batch]
            assert torch.equal(cache.gather(tables), reference(tables))
    assert len(cache.entries) <= 3 * len(step.live) + 64


def test_tables_edited_only_at_their_end_are_written_once() -> None:
    cache = HostBlockTables()
    tables = [[5, 6], [7]]
    cache.gather(tables)
    cache.rows[:] = -1  # anything not rewritten would show
    tables[1].append(9)
    out = cache.gather(tables)
    assert out.tolist() == [[-1, -1], [-1, 9]]  # only the new block was written


def test_a_table_shrunk_in_place_is_written_whole() -> None:
    cache = HostBlockTables()
    tables = [[5, 6, 8], [7]]
    cache.gather(tables)
    tables[0].pop()
    assert torch.equal(cache.gather(tables), reference(tables))


def test_stale_rows_are_freed_and_reused() -> None:
    cache = HostBlockTables(num_rows=4)
    old = [[i] for i in range(70)]
    cache.gather(old)
    fresh = [[1, 2]]
    for _ in range(STALE_STEPS):
        cache.gather(fresh)
    assert len(cache.entries) == 1 and torch.equal(cache.gather(fresh), reference(fresh))
