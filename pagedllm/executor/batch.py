"""Flatten one step's sequences into the model's inputs and the attention metadata.

The batch is built on the host; on an accelerator in pinned memory, then copied with
`to(device)` without the host waiting (device_copy.py), or into a captured graph's static
inputs (cuda_graph.py).
"""

import dataclasses
from dataclasses import dataclass

import torch

from pagedllm.forward_context import AttentionMetadata


@dataclass
class SeqChunk:
    """One sequence's share of a step: `token_ids` at positions start, start + 1, ..."""

    token_ids: list[int]
    start: int
    block_table: list[int]


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


def prepare_batch(
    chunks: list[SeqChunk], block_size: int, device: torch.device | str
) -> BatchInputs:
    """The step's batch on `device`."""
    device = torch.device(device)
    return host_batch(chunks, block_size, pin_memory=device.type != "cpu").to(device)


def host_batch(chunks: list[SeqChunk], block_size: int, pin_memory: bool = False) -> BatchInputs:
    """The step's batch on the host (in pinned memory if asked: an accelerator's step)."""
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    query_lens = [len(c.token_ids) for c in chunks]
    seq_lens = [c.start + n for c, n in zip(chunks, query_lens, strict=True)]
    for chunk, end in zip(chunks, seq_lens, strict=True):
        input_ids += chunk.token_ids
        span = range(chunk.start, end)
        positions += span
        table = chunk.block_table
        slots += [table[p // block_size] * block_size + p % block_size for p in span]
    max_blocks = max(len(c.block_table) for c in chunks)
    block_tables = [c.block_table + [0] * (max_blocks - len(c.block_table)) for c in chunks]
    starts = [0]
    for n in query_lens:
        starts.append(starts[-1] + n)

    def as_tensor(values: list, dtype: torch.dtype) -> torch.Tensor:
        if pin_memory:
            return torch.tensor(values, dtype=dtype, pin_memory=True)
        return torch.tensor(values, dtype=dtype)

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
