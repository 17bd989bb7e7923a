"""BlockTableSender / BlockTableReceiver: every step's tables on the receiving rank equal
rank 0's, over steps of a real BlockManager (appends, copy on write, preemption and
readmission, finished requests), through pickling as the ranks exchange them; decode
steps carry only appended blocks, and the receiver's lists grow in place."""

import pickle

from pagedllm.core.sequence import Sequence
from pagedllm.executor.batch import SeqChunk
from pagedllm.executor.model_runner import StepInput
from pagedllm.executor.table_deltas import AppendedBlocks, BlockTableReceiver, BlockTableSender
from tests.executor.block_manager_steps import random_block_steps


def step_of(seqs: list[Sequence], finished: set[str]) -> StepInput:
    chunks = [
        SeqChunk([1], s.num_computed_tokens, s.block_table, (s.request_id, s.seq_id)) for s in seqs
    ]
    return StepInput(chunks, [], [], [], finished_req_ids=finished)


def test_the_receiver_holds_rank_0s_tables_through_random_steps() -> None:
    sender, receiver = BlockTableSender(), BlockTableReceiver()
    appended_only = 0
    for step in random_block_steps(seed=1):
        sent = sender.encode(step_of(step.batch, step.finished_req_ids))
        wire = pickle.loads(pickle.dumps(sent))
        appended_only += sum(isinstance(c.block_table, AppendedBlocks) for c in wire.chunks)
        got = receiver.decode(wire)
        assert [c.block_table for c in got.chunks] == [s.block_table for s in step.batch]
        assert set(receiver.tables) <= set(sender.sent)
    assert appended_only > 1000  # most chunks sent only their news


def test_a_decode_step_sends_the_new_block_and_grows_the_same_list() -> None:
    sender, receiver = BlockTableSender(), BlockTableReceiver()
    table = [3, 8]
    first = receiver.decode(pickle.loads(pickle.dumps(sender.encode(step_of_table(table)))))
    held = first.chunks[0].block_table
    table.append(5)
    wire = sender.encode(step_of_table(table))
    assert wire.chunks[0].block_table == AppendedBlocks([5])
    second = receiver.decode(pickle.loads(pickle.dumps(wire)))
    assert second.chunks[0].block_table is held and held == [3, 8, 5]
    done = receiver.decode(sender.encode(StepInput([], [], [], [], finished_req_ids={"r"})))
    assert not done.chunks and not receiver.tables and not sender.sent


def test_a_chunk_without_a_key_is_sent_whole() -> None:
    sender = BlockTableSender()
    chunk = SeqChunk([1], 0, [4])
    for _ in range(2):
        assert sender.encode(StepInput([chunk], [], [], [])).chunks[0].block_table == [4]


def step_of_table(table: list[int]) -> StepInput:
    return StepInput([SeqChunk([1], 0, table, ("r", 0))], [], [], [])
