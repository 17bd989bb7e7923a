"""check_stop (pagedllm/engine/stop_checker.py) against vLLM's stop rules: EOS unless
ignore_eos, stop_token_ids, stop strings (cut from the text unless include_stop_str_in_output),
all only after min_tokens (stop strings in the text of later tokens); then a completed
structured-output constraint (any time), then max_tokens and max_model_len."""

import pytest

from pagedllm.core.sequence import Sequence, SequenceStatus
from pagedllm.engine.stop_checker import check_stop
from pagedllm.sampling_params import SamplingParams

EOS = 2
MAX_MODEL_LEN = 64


def seq_with_outputs(outputs: list[int], num_prompt: int = 4) -> Sequence:
    seq = Sequence(0, list(range(10, 10 + num_prompt)), block_size=4)
    for token in outputs:
        seq.append_token(token)
    return seq


def check(outputs: list[int], text: str = "", new_chars: int = 0, **params: object):
    seq = seq_with_outputs(outputs)
    return check_stop(seq, SamplingParams(**params), EOS, MAX_MODEL_LEN, text, new_chars)


def test_running_sequence_does_not_stop() -> None:
    assert check([5, 6], "ab", 1) is None


def test_eos_stops_unless_ignore_eos() -> None:
    decision = check([5, EOS])
    assert decision.status is SequenceStatus.FINISHED_STOPPED
    assert decision.stop_reason is None and decision.truncate_text_to is None
    assert check([5, EOS], ignore_eos=True) is None


def test_stop_token_id_is_the_stop_reason() -> None:
    decision = check([5, 7], stop_token_ids=[7, 9])
    assert (decision.status, decision.stop_reason) == (SequenceStatus.FINISHED_STOPPED, 7)


def test_min_tokens_delays_eos_and_stop_tokens() -> None:
    assert check([EOS], min_tokens=2) is None
    assert check([7], min_tokens=2, stop_token_ids=[7]) is None
    assert check([5, EOS], min_tokens=2).status is SequenceStatus.FINISHED_STOPPED


def test_min_tokens_leaves_its_tokens_text_unsearched() -> None:
    """vLLM's detokenizer: stop strings are looked for once more than min_tokens tokens are
    out, in the text that ends in the newer tokens."""
    assert check([5], "Paris", new_chars=5, stop=["Paris"], min_tokens=1) is None
    assert check([5, 6], "Paris.", new_chars=1, stop=["Paris"], min_tokens=1) is None
    decision = check([5, 6], "Paris.", new_chars=1, stop=["s."], min_tokens=1)
    assert decision.truncate_text_to == len("Pari")
    assert check([5], "Paris", new_chars=5, stop=["Paris"]).truncate_text_to == 0


def test_stop_string_cuts_text_before_it() -> None:
    decision = check([5, 6, 8], "Paris. The", new_chars=5, stop=["."])
    assert decision.status is SequenceStatus.FINISHED_STOPPED
    assert decision.stop_reason == "."
    assert decision.truncate_text_to == len("Paris")


def test_include_stop_str_in_output_keeps_it() -> None:
    decision = check([5], "Paris. The", 4, stop=". T", include_stop_str_in_output=True)
    assert decision.truncate_text_to == len("Paris. T")


def test_stop_string_spanning_earlier_text_is_found() -> None:
    """The new characters complete a stop string that began in earlier tokens."""
    decision = check([5, 6], "Hello wor", new_chars=2, stop=["llo wo"])
    assert decision.truncate_text_to == 2


def test_stop_string_wholly_in_old_text_is_not_searched_again() -> None:
    """Only a stop string that ends in the new characters counts (it was checked before)."""
    assert check([5, 6], "a.bc", new_chars=1, stop=["."]) is None
    assert check([5, 6], "a.bc", new_chars=0, stop=["b"]) is None


def test_earliest_stop_string_wins() -> None:
    """vLLM takes the first listed one found, which can leave "x" in the text."""
    decision = check([5], "wxyz", new_chars=3, stop=["z", "x", "xy"])
    assert (decision.stop_reason, decision.truncate_text_to) == ("x", 1)


def test_max_tokens_is_length() -> None:
    assert check([5, 6], max_tokens=3) is None
    decision = check([5, 6, 7], max_tokens=3)
    assert (decision.status, decision.stop_reason) == (SequenceStatus.FINISHED_LENGTH, None)


def test_eos_at_max_tokens_is_stop() -> None:
    assert check([5, EOS], max_tokens=2).status is SequenceStatus.FINISHED_STOPPED


@pytest.mark.parametrize("num_outputs, stops", [(59, False), (60, True)])
def test_max_model_len_is_length(num_outputs: int, stops: bool) -> None:
    decision = check([5] * num_outputs, max_tokens=None)
    assert (decision is not None) == stops
    if stops:
        assert decision.status is SequenceStatus.FINISHED_LENGTH


def test_a_completed_constraint_stops_and_an_unfinished_one_hits_max_tokens() -> None:
    """A grammar with nothing left but EOS ends the answer as "stop", even at max_tokens or
    before min_tokens (nothing else can be sampled); an unfinished one at max_tokens is
    "length"."""
    seq = seq_with_outputs([5, 6])
    for params in (SamplingParams(max_tokens=2), SamplingParams(min_tokens=5)):
        decision = check_stop(seq, params, EOS, MAX_MODEL_LEN, "", 0, grammar_terminated=True)
        assert decision.status is SequenceStatus.FINISHED_STOPPED
    decision = check_stop(seq, SamplingParams(max_tokens=2), EOS, MAX_MODEL_LEN, "", 0)
    assert decision.status is SequenceStatus.FINISHED_LENGTH
