"""Per-step attention metadata, set by the model runner and read by Attention layers.

Every model's forward stays `(input_ids, positions)`; what attention needs to find its
tokens in the paged KV cache travels here instead.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch


@dataclass
class AttentionMetadata:
    """The flat batch of one step: B sequences, T new tokens in all.

    slot_mapping:    [T] int64, cache slot (block_id * block_size + offset) of each new token.
    query_start_loc: [B + 1] int32, sequence i's new tokens are [qsl[i], qsl[i + 1]).
    seq_lens:        [B] int32, tokens of sequence i in the cache after this step
                     (cached context + new tokens).
    block_tables:    [B, max_blocks] int32, sequence i's physical blocks, padded with 0.
    query_lens_cpu / seq_lens_cpu: the same lengths as Python ints, so backends can plan
                     without a device-to-host sync.
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

    @property
    def max_query_len(self) -> int:
        return max(self.query_lens_cpu, default=0)

    @property
    def max_seq_len(self) -> int:
        return max(self.seq_lens_cpu, default=0)


_attn_metadata: AttentionMetadata | None = None


@contextmanager
def set_forward_context(attn_metadata: AttentionMetadata) -> Iterator[None]:
    global _attn_metadata
    previous, _attn_metadata = _attn_metadata, attn_metadata
    try:
        yield
    finally:
        _attn_metadata = previous


def get_attn_metadata() -> AttentionMetadata:
    if _attn_metadata is None:
        raise RuntimeError("Attention ran outside set_forward_context(); the runner sets it")
    return _attn_metadata
