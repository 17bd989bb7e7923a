"""The forward context: set per step by the runner, read by layers; host-side lengths give
every plan without reading a device tensor."""

import threading

import pytest
import torch

from pagedllm.forward_context import (
    AttentionMetadata,
    get_attn_metadata,
    get_max_seq_len,
    set_forward_context,
)


def _metadata(query_lens: list[int], seq_lens: list[int]) -> AttentionMetadata:
    starts = torch.tensor([0, *query_lens]).cumsum(0).to(torch.int32)
    return AttentionMetadata(
        slot_mapping=torch.arange(sum(query_lens)),
        query_start_loc=starts,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=torch.zeros(len(seq_lens), 4, dtype=torch.int32),
        query_lens_cpu=query_lens,
        seq_lens_cpu=seq_lens,
    )


def test_contexts_nest_and_restore_the_outer_one() -> None:
    outer, inner = _metadata([1], [5]), _metadata([3], [3])
    with set_forward_context(outer):
        with set_forward_context(inner):
            assert get_attn_metadata() is inner and get_max_seq_len() == 3
        assert get_attn_metadata() is outer and get_max_seq_len() == 5
    with pytest.raises(RuntimeError, match="outside set_forward_context"):
        get_attn_metadata()


def test_max_seq_len_is_zero_outside_a_step() -> None:
    """Reference: RoPE then keeps the cache it was built with."""
    assert get_max_seq_len() == 0


def test_lengths_and_decode_rows_of_a_mixed_batch() -> None:
    """Reference: the lengths by hand; decodes are the sequences with one new token."""
    md = _metadata([4, 1, 2, 1], [4, 10, 7, 3])
    assert (md.num_seqs, md.max_query_len, md.max_seq_len) == (4, 4, 10)
    assert md.query_starts_cpu == [0, 4, 5, 7, 8]
    decodes = md.decode_rows
    assert decodes.seq_idx.tolist() == [1, 3] and decodes.rows.tolist() == [4, 7]
    assert decodes.max_seq_len == 10
    assert md.decode_rows is decodes  # built once per step


def test_no_decode_rows_without_decodes() -> None:
    assert _metadata([3, 2], [3, 9]).decode_rows is None


def test_each_thread_sees_its_own_step() -> None:
    """Engines stepping in two threads of one process read their own metadata."""
    outer = _metadata([1], [5])
    seen = []
    with set_forward_context(outer):
        thread = threading.Thread(target=lambda: seen.append(get_max_seq_len()))
        thread.start()
        thread.join()
        assert get_attn_metadata() is outer
    assert seen == [0], "another thread's step is not this one's"
