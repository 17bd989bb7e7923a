"""Random steps of a real BlockManager, for the tests of what follows block tables from step
to step (host_block_tables.py, table_deltas.py): sequences admitted, forked (so that their
shared tails are copied on write), preempted and readmitted (a new table list), finished,
and every running one decoding a token a step."""

import random
from collections.abc import Iterator
from dataclasses import dataclass, field

from pagedllm.core.block_manager import BlockManager
from pagedllm.core.sequence import Sequence, new_seq_id


@dataclass
class BlockStep:
    live: list[Sequence]  # every running sequence, after this step's appends
    batch: list[Sequence]  # a random subset of them, in random order (maybe empty)
    finished_req_ids: set[str] = field(default_factory=set)  # requests that ended


def random_block_steps(seed: int, num_steps: int = 300) -> Iterator[BlockStep]:
    rng = random.Random(seed)
    bm = BlockManager(num_blocks=500, block_size=4)
    live: list[Sequence] = []
    for _ in range(num_steps):
        finished, action = set(), rng.random()
        if action < 0.15 and bm.num_free_blocks > 40:
            prompt = [rng.randrange(50) for _ in range(rng.randrange(1, 30))]
            seq = Sequence(new_seq_id(), prompt, 4, request_id=f"r{rng.random()}")
            bm.allocate(seq)
            seq.num_computed_tokens = seq.num_tokens
            live.append(seq)
        elif action < 0.22 and live and bm.num_free_blocks > 40:
            parent = rng.choice(live)
            child = Sequence(new_seq_id(), parent.token_ids, 4, request_id=parent.request_id)
            bm.fork(parent, child)
            live.append(child)
        elif action < 0.3 and live:
            seq = live.pop(rng.randrange(len(live)))
            bm.free(seq)
            if rng.random() < 0.5 and bm.can_allocate(seq):  # preempted, readmitted
                seq.num_computed_tokens = 0
                bm.allocate(seq)
                seq.num_computed_tokens = seq.num_tokens
                live.append(seq)
            elif all(s.request_id != seq.request_id for s in live):
                finished.add(seq.request_id)
        for seq in live:
            if bm.can_append(seq, 1):
                seq.append_token(1)
                bm.append_slots(seq, 1)
                seq.num_computed_tokens += 1
        bm.check_invariants(live)
        yield BlockStep(live, rng.sample(live, rng.randrange(0, len(live) + 1)), finished)
