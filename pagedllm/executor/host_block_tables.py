"""HostBlockTables: the step's block tables [B, M] int32 from rows kept across steps.

A running sequence's block table changes little from one step to the next: a decode step
appends a block every `block_size` tokens, and the block manager replaces the list
(never edits it in place) when it reallocates a preempted sequence or copies a shared
block on write. So each table list gets a row of a persistent int32 array, keyed by the
list itself (held here, so its id is not reused), and a step writes only the blocks
appended since the step before; the batch's tables are one gather of their rows. Building
them from the lists instead converts every block id of every sequence every step (about
35 ns each: a millisecond at 256 sequences of 700 tokens), which is host time a GPU's
step waits for (vLLM keeps its block tables the same way, `BlockTable` in its worker).
`pagedllm bench throughput` on a shape with next to no forward re-measures the step's
host time (BENCHMARKS.md, "The engine's host work a step").

A table not seen for `STALE_STEPS` steps (its sequence finished, was preempted or
replaced its list) loses its row once the tables held outnumber twice the batch's
sequences plus 64. The other ranks of a parallel world get their tables as what was
appended to them (table_deltas.py) into lists they keep, so they hit this cache too.
"""

import numpy as np
import torch

STALE_STEPS = 4  # more than the steps a pipeline's micro-batches leave a sequence out


class HostBlockTables:
    def __init__(self, num_rows: int = 64, num_cols: int = 16) -> None:
        self.rows = np.zeros((num_rows, num_cols), dtype=np.int32)
        # id(table) -> [table, row, blocks written, last step it was used]
        self.entries: dict[int, list] = {}
        self.free_rows = list(range(num_rows - 1, -1, -1))
        self.step = 0

    def gather(self, tables: list[list[int]]) -> torch.Tensor:
        """[len(tables), longest table] int32, zero past each table's end."""
        self.step += 1
        width = max(map(len, tables))
        if width > self.rows.shape[1]:
            self._grow(self.rows.shape[0], max(width, 2 * self.rows.shape[1]))
        rows = [self._row(table) for table in tables]
        out = torch.from_numpy(self.rows[rows, :width])  # a fresh array: fancy indexing copies
        if len(self.entries) > 2 * len(tables) + 64:
            self._evict_stale()
        return out

    def _row(self, table: list[int]) -> int:
        entry = self.entries.get(id(table))
        if entry is None:
            entry = self.entries[id(table)] = [table, self._free_row(), 0, self.step]
        _, row, written, _ = entry
        if len(table) != written:
            if len(table) < written:  # shrunk in place: not the block manager's way
                written = 0
            self.rows[row, written : len(table)] = table[written:]
            self.rows[row, len(table) :] = 0
            entry[2] = len(table)
        entry[3] = self.step
        return row

    def _free_row(self) -> int:
        if not self.free_rows:
            num_rows = self.rows.shape[0]
            self._grow(2 * num_rows, self.rows.shape[1])
            self.free_rows = list(range(2 * num_rows - 1, num_rows - 1, -1))
        return self.free_rows.pop()

    def _grow(self, num_rows: int, num_cols: int) -> None:
        grown = np.zeros((num_rows, num_cols), dtype=np.int32)
        grown[: self.rows.shape[0], : self.rows.shape[1]] = self.rows
        self.rows = grown

    def _evict_stale(self) -> None:
        for key, (_, row, _, last) in list(self.entries.items()):
            if self.step - last >= STALE_STEPS:
                del self.entries[key]
                self.free_rows.append(row)
