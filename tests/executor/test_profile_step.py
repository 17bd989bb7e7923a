"""pagedllm/executor/profile_step.py: the largest step, what a GPU's memory is profiled with."""

import pytest

from pagedllm.executor.profile_step import profile_chunks, profile_rows


@pytest.mark.parametrize(
    "tokens, max_seqs, max_len, lengths",
    [
        (2048, 256, 1024, [8] * 256),
        (10, 256, 1024, [1] * 10),
        (10, 4, 1024, [3, 3, 2, 2]),
        (8192, 2, 1000, [1000, 1000]),  # within max_model_len
    ],
)
def test_the_tokens_are_split_evenly_over_the_sequences(
    tokens: int, max_seqs: int, max_len: int, lengths: list[int]
) -> None:
    chunks, blocks = profile_chunks(tokens, max_seqs, max_len, block_size=16)
    assert [len(c.token_ids) for c in chunks] == lengths
    assert all(c.start == 0 and c.key is None for c in chunks)
    tables = [c.block_table for c in chunks]
    assert [len(t) for t in tables] == [-(-n // 16) for n in lengths]
    assert sorted(b for t in tables for b in t) == list(range(blocks))  # each block once


def test_every_row_samples_with_the_costliest_features() -> None:
    chunks, _ = profile_chunks(64, 4, 1024, 16)
    rows = profile_rows(chunks, max_logprobs=20, vocab_size=32)
    assert len(rows) == 4 and all(r.prompt_token_ids == chunks[0].token_ids for r in rows)
    params = rows[0].params
    assert (params.top_k, params.top_p, params.logprobs) == (32, 0.9, 20)
    assert params.repetition_penalty > 1 and params.frequency_penalty > 0
    assert params.presence_penalty > 0 and params.temperature == 1.0
    assert profile_rows(chunks, 0, 1000)[0].params.logprobs is None
