"""The other ranks keep each sequence's block table; each step sends them what changed.

Rank 0 plans every step and sends it to every other tensor- and pipeline-parallel rank. A
sequence's block table grows by a block every `block_size` tokens and is otherwise the
same from step to step, so a chunk carries its whole table only the first time its list
is sent (or when the block manager replaced it: reallocated after a preemption, a block
copied on write; see Sequence.block_table), and afterwards only the blocks appended since
(AppendedBlocks), vLLM's `new_block_ids`. A rank receiving the step extends its own list
in place, so its ModelRunner's HostBlockTables keeps that list's row and writes only the
new blocks, as rank 0's does.

Chunks are known by `SeqChunk.key`, (request id, sequence id); both sides read the same
messages in the same order, so they agree on what each holds, and both forget a
request's tables when it ends (`StepInput.finished_req_ids`). A chunk without a key
(built outside the engine) is always sent whole.
"""

import dataclasses
from dataclasses import dataclass

from pagedllm.executor.batch import SeqChunk
from pagedllm.executor.model_runner import StepInput
from pagedllm.executor.row_deltas import forget


@dataclass
class AppendedBlocks:
    """In place of a chunk's block table: the blocks appended since its last step."""

    blocks: list[int]


class BlockTableSender:
    """Rank 0: each chunk's table, or what was appended to it since it was last sent."""

    def __init__(self) -> None:
        self.sent: dict[tuple[str, int], tuple[list[int], int]] = {}  # the list, its length

    def encode(self, step: StepInput) -> StepInput:
        forget(self.sent, step.finished_req_ids)
        return dataclasses.replace(step, chunks=[self._chunk(c) for c in step.chunks])

    def _chunk(self, chunk: SeqChunk) -> SeqChunk:
        if chunk.key is None:
            return chunk
        table, held = chunk.block_table, self.sent.get(chunk.key)
        self.sent[chunk.key] = (table, len(table))
        if held is None or held[0] is not table or held[1] > len(table):
            return chunk
        return dataclasses.replace(chunk, block_table=AppendedBlocks(table[held[1] :]))


class BlockTableReceiver:
    """Every other rank: the tables rank 0 has sent, brought up to date by each step."""

    def __init__(self) -> None:
        self.tables: dict[tuple[str, int], list[int]] = {}

    def decode(self, step: StepInput) -> StepInput:
        forget(self.tables, step.finished_req_ids)
        return dataclasses.replace(step, chunks=[self._chunk(c) for c in step.chunks])

    def _chunk(self, chunk: SeqChunk) -> SeqChunk:
        if isinstance(chunk.block_table, AppendedBlocks):
            table = self.tables[chunk.key]
            table += chunk.block_table.blocks
            return dataclasses.replace(chunk, block_table=table)
        if chunk.key is not None:
            self.tables[chunk.key] = chunk.block_table
        return chunk
