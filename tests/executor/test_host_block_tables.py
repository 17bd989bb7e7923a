"""HostBlockTables against the tables built from the lists (batch._block_tables), over
steps of a real BlockManager: appends, forks with copy on write, frees and reallocation,
eviction of stale rows and growth past the first array."""

import random

import torch

from pagedllm.core.block_manager import BlockManager
from pagedllm.core.sequence import Sequence, new_seq_id
from pagedllm.executor.batch import SeqChunk, _block_tables
from pagedllm.executor.host_block_tables import STALE_STEPS, HostBlockTables


def reference(tables: list[list[int]]) -> torch.Tensor:
    return _block_tables([SeqChunk([0], 0, table) for table in tables])


def test_rows_follow_a_block_manager_through_random_steps() -> None:
    rng = random.Random(0)
    bm = BlockManager(num_blocks=400, block_size=4)
    cache = HostBlockTables(num_rows=2, num_cols=2)  # grows in both directions
    live: list[Sequence] = []
    for _ in range(300):
        action = rng.random()
        if action < 0.15 and bm.num_free_blocks > 40:
            seq = Sequence(
                new_seq_id(), [rng.randrange(50) for _ in range(rng.randrange(1, 30))], 4
            )
            bm.allocate(seq)
            seq.num_computed_tokens = seq.num_tokens
            live.append(seq)
        elif action < 0.22 and live and bm.num_free_blocks > 40:
            parent = rng.choice(live)
            child = Sequence(new_seq_id(), parent.token_ids, 4)
            bm.fork(parent, child)
            live.append(child)
        elif action < 0.3 and live:
            seq = live.pop(rng.randrange(len(live)))
            bm.free(seq)
            if rng.random() < 0.5:  # preempted and readmitted: a new list, maybe equal ids
                seq.num_computed_tokens = 0
                bm.allocate(seq)
                seq.num_computed_tokens = seq.num_tokens
                live.append(seq)
        for seq in live:  # a decode step each: appends, and copies shared tails on write
            if bm.can_append(seq, 1):
                seq.append_token(1)
                bm.append_slots(seq, 1)
                seq.num_computed_tokens += 1
        if live:
            batch = rng.sample(live, rng.randrange(1, len(live) + 1))
            tables = [seq.block_table for seq in batch]
            assert torch.equal(cache.gather(tables), reference(tables))
    bm.check_invariants(live)
    assert len(cache.entries) <= 2 * len(live) + 64 + len(live)


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
