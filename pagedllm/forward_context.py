"""Per-step attention metadata, set by the model runner and read by the layers.

Every model's forward stays `(input_ids, positions)`; what attention needs to find its
tokens in the paged KV cache travels here instead, with the lengths also as Python ints so
that no layer reads a device tensor on the host to plan (RoPE sizes its table by them too).
"""

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from itertools import accumulate
from typing import NamedTuple

import torch

from pagedllm.device_copy import to_device


class DecodeRows(NamedTuple):
    """The decodes (q_len == 1) of a batch that also holds prefill chunks."""

    seq_idx: torch.Tensor  # [Bd] their sequence indices, int64
    rows: torch.Tensor  # [Bd] their token rows in T, int64
    max_seq_len: int  # their longest sequence


@dataclass
class AttentionMetadata:
    """The flat batch of one step: B sequences, T new tokens in all.

    slot_mapping:    [T] int64, cache slot (block_id * block_size + offset) of each new token.
    query_start_loc: [B + 1] int32, sequence i's new tokens are [qsl[i], qsl[i + 1]).
    seq_lens:        [B] int32, tokens of sequence i in the cache after this step
                     (cached context + new tokens).
    block_tables:    [B, max_blocks] int32, sequence i's physical blocks, padded with 0.
    query_lens_cpu / seq_lens_cpu: the same lengths as Python ints, so layers can plan
                     without a device-to-host sync.

    Sequence i's new tokens sit at positions seq_lens[i] - query_lens[i] .. seq_lens[i] - 1.
    """

    slot_mapping: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_tables: torch.Tensor
    query_lens_cpu: list[int]
    seq_lens_cpu: list[int]

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_cpu)

    @cached_property
    def max_query_len(self) -> int:
        return max(self.query_lens_cpu, default=0)

    @cached_property
    def max_seq_len(self) -> int:
        """Every layer of the step asks; computed once."""
        return max(self.seq_lens_cpu, default=0)

    @cached_property
    def query_starts_cpu(self) -> list[int]:
        """query_start_loc as Python ints."""
        return list(accumulate(self.query_lens_cpu, initial=0))

    @cached_property
    def decode_rows(self) -> DecodeRows | None:
        """None when no sequence decodes. Built once per step, not by every layer: on an
        accelerator each index tensor is a host-to-device copy that waits for the stream."""
        decodes = [i for i, n in enumerate(self.query_lens_cpu) if n == 1]
        if not decodes:
            return None
        device = self.seq_lens.device
        starts = self.query_starts_cpu
        return DecodeRows(
            to_device(decodes, torch.int64, device),
            to_device([starts[i] for i in decodes], torch.int64, device),
            max(self.seq_lens_cpu[i] for i in decodes),
        )


class _Context(threading.local):
    """The running step's metadata, per thread: engines stepping in two threads of one
    process (two AsyncLLMs, two LLMs) each see their own."""

    attn_metadata: AttentionMetadata | None = None


_context = _Context()


@contextmanager
def set_forward_context(attn_metadata: AttentionMetadata) -> Iterator[None]:
    previous, _context.attn_metadata = _context.attn_metadata, attn_metadata
    try:
        yield
    finally:
        _context.attn_metadata = previous


def get_attn_metadata() -> AttentionMetadata:
    attn_metadata = _context.attn_metadata
    if attn_metadata is None:
        raise RuntimeError("Attention ran outside set_forward_context(); the runner sets it")
    return attn_metadata


def get_max_seq_len() -> int:
    """1 + the largest position of this step's tokens, from the host-side lengths; 0 outside
    set_forward_context (a layer called on its own). Lets a layer size a position-indexed
    table without reading the positions tensor, a host sync on accelerators."""
    attn_metadata = _context.attn_metadata
    return 0 if attn_metadata is None else attn_metadata.max_seq_len
