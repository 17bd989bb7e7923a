"""prepare_batch (pagedllm/executor/batch.py) on a mixed batch worked out by hand. Reference:
vLLM's definitions: slot = block_table[p // block_size] * block_size + p % block_size for each
new token at position p, query_start_loc the prefix sums of the new-token counts, seq_lens the
tokens in the cache after the step, block tables padded with 0."""

import pytest
import torch

from pagedllm._custom_ops import has_cpu_kernels
from pagedllm.executor.batch import SeqChunk, as_decode_rows, host_batch, prepare_batch
from pagedllm.executor.host_block_tables import HostBlockTables
from pagedllm.layers.attention_backends.cpu import CpuAttentionBackend
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


def test_as_decode_rows_gives_each_token_its_own_row_over_its_causal_context() -> None:
    """Reference: the chunked batch's definition (token j of a chunk at `start` sees
    start + j + 1 cache entries through its chunk's table); ids, positions and slots kept."""
    batch = host_batch(CHUNKS, BLOCK_SIZE)
    rows = as_decode_rows(batch)
    meta = rows.attn_metadata
    assert rows.input_ids is batch.input_ids and rows.positions is batch.positions
    assert meta.slot_mapping is batch.attn_metadata.slot_mapping
    assert meta.query_start_loc.tolist() == list(range(9))
    assert meta.seq_lens.tolist() == meta.seq_lens_cpu == [1, 2, 3, 4, 5, 7, 4, 5]
    assert meta.query_lens_cpu == [1] * 8
    tables = [[7, 3, 0]] * 5 + [[1, 5, 0]] + [[2, 9, 4]] * 2
    assert meta.block_tables.tolist() == tables


@pytest.mark.skipif(not has_cpu_kernels(), reason="pagedllm._C is not built")
def test_decode_rows_attend_as_the_chunked_step_bit_for_bit() -> None:
    """Reference: the CPU backend on the chunked batch (its prefill kernel for chunks):
    the decode kernel on the decode rows gives the same bits, row for row."""
    torch.manual_seed(0)
    batch = host_batch(CHUNKS, BLOCK_SIZE)
    num_heads, num_kv_heads, head_size = 4, 2, 64
    shape = (10, BLOCK_SIZE, num_kv_heads, head_size)
    k_cache, v_cache = torch.randn(shape), torch.randn(shape)
    query = torch.randn(batch.input_ids.shape[0], num_heads, head_size)
    backend = CpuAttentionBackend()
    chunked = backend.forward(query, k_cache, v_cache, batch.attn_metadata, 0.125)
    rows = backend.forward(query, k_cache, v_cache, as_decode_rows(batch).attn_metadata, 0.125)
    assert torch.equal(rows, chunked)
