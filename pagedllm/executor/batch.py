"""Flatten one step's sequences into the model's inputs and the attention metadata.

The batch is built on the host; on an accelerator in pinned memory, then copied with
`to(device)` without the host waiting (device_copy.py), or into a captured graph's static
inputs (cuda_graph.py).
"""

import dataclasses
import itertools
from dataclasses import dataclass

import torch

from pagedllm.executor.host_block_tables import HostBlockTables
from pagedllm.forward_context import AttentionMetadata


@dataclass
class SeqChunk:
    """One sequence's share of a step: `token_ids` at positions start, start + 1, ..."""

    token_ids: list[int]
    start: int
    block_table: list[int]
    # (request id, sequence id): how the other ranks know the chunk's table from step to
    # step (table_deltas.py); None for a chunk built outside the engine.
    key: tuple[str, int] | None = None
    # The LoRA slot its rows run with (lora/slot_planner.py; -1: none).
    lora_slot: int = -1


@dataclass
class BatchInputs:
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    attn_metadata: AttentionMetadata

    def to(self, device: torch.device) -> "BatchInputs":
        """This batch on `device`: itself on the CPU, else its tensors copied without
        waiting (from pinned memory when prepare_batch pinned them)."""
        if device.type == "cpu":
            return self
        md = self.attn_metadata

        def copy(t: torch.Tensor) -> torch.Tensor:
            return t.to(device, non_blocking=True)

        metadata = dataclasses.replace(
            md,
            slot_mapping=copy(md.slot_mapping),
            query_start_loc=copy(md.query_start_loc),
            seq_lens=copy(md.seq_lens),
            block_tables=copy(md.block_tables),
        )
        return BatchInputs(copy(self.input_ids), copy(self.positions), metadata)


def write_placeholders(
    input_ids: torch.Tensor, placeholders: tuple[torch.Tensor, torch.Tensor] | None
) -> None:
    """input_ids[where] = ids on the tensors' device, for (where, ids) = placeholders: the
    tokens a step in flight sampled, in place of the 0s its placeholders hold (async
    scheduling; ModelRunner._placeholder_tokens). None: nothing to write."""
    if placeholders is not None:
        where, ids = placeholders
        input_ids.index_copy_(0, where, ids)


def prepare_batch(
    chunks: list[SeqChunk], block_size: int, device: torch.device | str
) -> BatchInputs:
    """The step's batch on `device`."""
    device = torch.device(device)
    return host_batch(chunks, block_size, pin_memory=device.type != "cpu").to(device)


def host_batch(
    chunks: list[SeqChunk],
    block_size: int,
    pin_memory: bool = False,
    tables: HostBlockTables | None = None,
) -> BatchInputs:
    """The step's batch on the host (in pinned memory if asked: an accelerator's step);
    `tables`: the runner's block-table rows kept across steps (else built from the lists)."""
    query_lens = [len(c.token_ids) for c in chunks]
    seq_lens = [c.start + n for c, n in zip(chunks, query_lens, strict=True)]
    input_ids: list[int] = []
    for chunk in chunks:
        input_ids += chunk.token_ids
    if tables is not None:
        block_tables = tables.gather([c.block_table for c in chunks])
    else:
        block_tables = _block_tables(chunks)
    starts = [0, *itertools.accumulate(query_lens)]
    if len(input_ids) == len(chunks):  # one token each (decode): a few Python ops a row
        positions = torch.tensor([c.start for c in chunks], dtype=torch.int64)
        slots = torch.tensor(
            [
                c.block_table[c.start // block_size] * block_size + c.start % block_size
                for c in chunks
            ],
            dtype=torch.int64,
        )
    else:  # prefill chunks: per token, in tensor ops rather than Python
        positions, slots = _positions_and_slots(chunks, query_lens, block_tables, block_size)

    def as_tensor(values: list | torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        tensor = values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=dtype)
        return tensor.pin_memory() if pin_memory else tensor

    metadata = AttentionMetadata(
        slot_mapping=as_tensor(slots, torch.int64),
        query_start_loc=as_tensor(starts, torch.int32),
        seq_lens=as_tensor(seq_lens, torch.int32),
        block_tables=as_tensor(block_tables, torch.int32),
        query_lens_cpu=query_lens,
        seq_lens_cpu=seq_lens,
    )
    return BatchInputs(
        input_ids=as_tensor(input_ids, torch.int64),
        positions=as_tensor(positions, torch.int64),
        attn_metadata=metadata,
    )


def as_decode_rows(batch: BatchInputs, pin_memory: bool = False) -> BatchInputs:
    """The same tokens with each one its own decode row: token j of a chunk at `start`
    attends to the sequence's first start + j + 1 cache entries through the chunk's block
    table, which is the causal attention its chunk gives it (the step writes every token's
    K and V before any attends). Rows come out in the same order, so the hidden states are
    laid out as the chunked batch's. A verification step of draft tokens (speculative
    decoding) built this way is a decode step, which the graph runners replay."""
    md = batch.attn_metadata
    chunk_of_row = [i for i, n in enumerate(md.query_lens_cpu) for _ in range(n)]
    seq_lens = [
        seq_len - n + j + 1
        for seq_len, n in zip(md.seq_lens_cpu, md.query_lens_cpu, strict=True)
        for j in range(n)
    ]
    rows = torch.tensor(chunk_of_row, dtype=torch.int64, device=md.block_tables.device)

    def pinned(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.pin_memory() if pin_memory else tensor

    metadata = AttentionMetadata(
        slot_mapping=md.slot_mapping,
        query_start_loc=pinned(torch.arange(len(seq_lens) + 1, dtype=torch.int32)),
        seq_lens=pinned(torch.tensor(seq_lens, dtype=torch.int32)),
        block_tables=pinned(md.block_tables.index_select(0, rows)),
        query_lens_cpu=[1] * len(seq_lens),
        seq_lens_cpu=seq_lens,
    )
    return BatchInputs(batch.input_ids, batch.positions, metadata)


def _block_tables(chunks: list[SeqChunk]) -> torch.Tensor:
    """[B, longest table] int32, zero past each table's end."""
    max_blocks = max(len(c.block_table) for c in chunks)
    flat: list[int] = []
    for chunk in chunks:
        flat += chunk.block_table
        flat += [0] * (max_blocks - len(chunk.block_table))
    return torch.tensor(flat, dtype=torch.int32).view(len(chunks), max_blocks)


def _positions_and_slots(
    chunks: list[SeqChunk], query_lens: list[int], block_tables: torch.Tensor, block_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's position [T] int64 and KV-cache slot [T] int64 (block_tables [B, M])."""
    lens = torch.tensor(query_lens, dtype=torch.int64)
    first_token = torch.cumsum(lens, 0) - lens  # each chunk's first row in the batch
    # Each token's chunk: 1 where a chunk begins, summed (repeat_interleave, without the
    # host read it would be on a device).
    row = torch.zeros(sum(query_lens), dtype=torch.int64)
    row[first_token[1:]] = 1
    row = row.cumsum(0)
    chunk_starts = torch.tensor([c.start for c in chunks], dtype=torch.int64)
    positions = chunk_starts[row] + torch.arange(row.shape[0]) - first_token[row]
    blocks = block_tables[row, positions // block_size].to(torch.int64)
    return positions, blocks * block_size + positions % block_size
