"""prepare_batch (pagedllm/executor/batch.py) on a mixed batch worked out by hand. Reference:
vLLM's definitions: slot = block_table[p // block_size] * block_size + p % block_size for each
new token at position p, query_start_loc the prefix sums of the new-token counts, seq_lens the
tokens in the cache after the step, block tables padded with 0."""

import pytest
import torch

from pagedllm.executor.batch import SeqChunk, host_batch, prepare_batch
from pagedllm.executor.host_block_tables import HostBlockTables
from tests.devices import DEVICES

BLOCK_SIZE = 4
CHUNKS = [
    SeqChunk([10, 11, 12, 13, 14], 0, [7, 3]),  # a whole prompt: positions 0..4
    SeqChunk([20], 6, [1, 5]),  # a decode: position 6, in block 5
    SeqChunk([30, 31], 3, [2, 9, 4]),  # a prefill chunk across a block boundary: 3, 4
]


@pytest.mark.parametrize("device", DEVICES)
def test_mixed_prefill_and_decode_batch(device: str) -> None:
    """On an accelerator built on the host in pinned memory and copied over."""
    batch = prepare_batch(CHUNKS, BLOCK_SIZE, device)
    meta = batch.attn_metadata

    def check(tensor: torch.Tensor, values: list, dtype: torch.dtype) -> None:
        assert tensor.device.type == device
        assert tensor.dtype == dtype and tensor.tolist() == values

    check(batch.input_ids, [10, 11, 12, 13, 14, 20, 30, 31], torch.int64)
    check(batch.positions, [0, 1, 2, 3, 4, 6, 3, 4], torch.int64)
    # 7*4+0..3, 3*4+0 | 5*4+2 | 2*4+3, 9*4+0
    check(meta.slot_mapping, [28, 29, 30, 31, 12, 22, 11, 36], torch.int64)
    check(meta.query_start_loc, [0, 5, 6, 8], torch.int32)
    check(meta.seq_lens, [5, 7, 5], torch.int32)
    check(meta.block_tables, [[7, 3, 0], [1, 5, 0], [2, 9, 4]], torch.int32)
    assert (meta.query_lens_cpu, meta.seq_lens_cpu) == ([5, 1, 2], [5, 7, 5])


def test_decode_only_batch_and_kept_block_tables() -> None:
    """One token a sequence takes its own path, and the runner's kept block-table rows give
    the same tensors as tables built from the lists."""
    chunks = [SeqChunk([20], 6, [1, 5]), SeqChunk([40], 0, [8]), SeqChunk([50], 9, [3, 6, 2])]
    for tables in (None, HostBlockTables()):
        batch = host_batch(chunks, BLOCK_SIZE, tables=tables)
        assert batch.positions.tolist() == [6, 0, 9] and batch.input_ids.tolist() == [20, 40, 50]
        assert batch.attn_metadata.slot_mapping.tolist() == [22, 32, 9]  # 5*4+2, 8*4, 2*4+1
        assert batch.attn_metadata.block_tables.tolist() == [[1, 5, 0], [8, 0, 0], [3, 6, 2]]
    mixed = host_batch(CHUNKS, BLOCK_SIZE, tables=HostBlockTables())
    assert mixed.attn_metadata.block_tables.tolist() == [[7, 3, 0], [1, 5, 0], [2, 9, 4]]
    assert mixed.attn_metadata.slot_mapping.tolist() == [28, 29, 30, 31, 12, 22, 11, 36]


def test_block_tables_are_not_modified() -> None:
    """Padding builds new rows: the sequences' own tables keep their length."""
    chunks = [SeqChunk([1], 0, [4]), SeqChunk([2, 3], 0, [5, 6])]
    prepare_batch(chunks, 1, "cpu")
    assert [c.block_table for c in chunks] == [[4], [5, 6]]


def test_a_host_batch_on_the_cpu_is_itself() -> None:
    batch = host_batch(CHUNKS, BLOCK_SIZE)
    assert batch.to(torch.device("cpu")) is batch
    assert not batch.input_ids.is_pinned()
