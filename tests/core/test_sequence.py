"""Sequence bookkeeping, checked against hand-computed counts (block size 4)."""

import pytest

from pagedllm.core.sequence import Sequence, SequenceStatus


def test_counts_and_blocks_follow_appended_tokens() -> None:
    seq = Sequence(7, [1, 2, 3, 4, 5], block_size=4)
    assert (seq.num_tokens, seq.num_prompt_tokens, seq.num_blocks) == (5, 5, 2)
    assert seq.request_id == "7" and seq.status is SequenceStatus.WAITING
    assert seq.output_token_ids == [] and seq.last_token_id == 5
    for token in (6, 7, 8, 9):
        seq.append_token(token)
    assert seq.output_token_ids == [6, 7, 8, 9] and seq.num_output_tokens == 4
    assert seq.num_blocks == 3
    assert seq.block_token_ids(1) == [5, 6, 7, 8] and seq.block_token_ids(2) == [9]


def test_prompt_and_output_lists_are_the_sequences_own_and_grow_in_place() -> None:
    prompt = [1, 2, 3]
    seq = Sequence(0, prompt, block_size=4)
    outputs = seq.output_token_ids
    prompt.append(99)  # the caller's list is not the sequence's
    seq.append_token(4)
    seq.append_token(5)
    assert outputs is seq.output_token_ids and outputs == [4, 5]
    assert seq.prompt_token_ids == [1, 2, 3] and seq.token_ids == [1, 2, 3, 4, 5]


def test_is_prefill_while_more_than_one_token_lacks_kv() -> None:
    seq = Sequence(0, [1, 2, 3], block_size=4)
    assert seq.is_prefill
    seq.num_computed_tokens = 2
    assert not seq.is_prefill  # one token left: a decode-shaped step
    seq.num_computed_tokens = 3
    seq.append_token(9)
    assert not seq.is_prefill
    assert Sequence(1, [1], block_size=4).is_prefill is False


def test_status_finished_and_reason() -> None:
    assert not SequenceStatus.WAITING.is_finished and not SequenceStatus.RUNNING.is_finished
    assert SequenceStatus.RUNNING.finish_reason is None
    reasons = {
        SequenceStatus.FINISHED_STOPPED: "stop",
        SequenceStatus.FINISHED_LENGTH: "length",
        SequenceStatus.FINISHED_ABORTED: "abort",
    }
    for status, reason in reasons.items():
        assert status.is_finished and status.finish_reason == reason
    seq = Sequence(0, [1], block_size=4, request_id="req-a")
    seq.status = SequenceStatus.FINISHED_LENGTH
    assert seq.is_finished and seq.request_id == "req-a"


def test_empty_prompt_is_rejected() -> None:
    with pytest.raises(ValueError, match="at least 1 token"):
        Sequence(0, [], block_size=4)
