"""Request and Completion (pagedllm/engine/request.py): the RequestOutput shown per output_kind.
Reference: vLLM's RequestOutputKind: CUMULATIVE shows everything so far, DELTA only what is new
since the last output, FINAL_ONLY one output once finished; text that may begin a stop string
is held back until the sequence ends; finish_reason is the sequence's, or "error" for sequences
ended by their request's failure."""

import pytest

from pagedllm.core.sequence import Sequence, SequenceStatus
from pagedllm.engine.request import Completion, Request
from pagedllm.engine.stop_checker import StopDecision
from pagedllm.outputs import Logprob
from pagedllm.sampling_params import RequestOutputKind, SamplingParams

PROMPT = [5, 6, 7]


def make_request(n: int = 1, **params: object) -> Request:
    request = Request("r", "prompt", PROMPT, SamplingParams(n=n, **params))
    for k in range(n):
        request.completions.append(Completion(k, Sequence(k, PROMPT, 4, request_id="r"), None))
    return request


def add(completion: Completion, token: int, text: str) -> None:
    """What the output processor does per token, with the detokenizer's text given."""
    completion.seq.append_token(token)
    completion.text += text


def test_cumulative_shows_everything_so_far() -> None:
    request = make_request()
    c = request.completions[0]
    add(c, 10, "a")
    add(c, 11, "b")
    assert request.make_output().outputs[0].token_ids == [10, 11]
    add(c, 12, "c")
    out = request.make_output()
    assert (out.outputs[0].token_ids, out.outputs[0].text) == ([10, 11, 12], "abc")
    assert (out.request_id, out.prompt, out.prompt_token_ids) == ("r", "prompt", PROMPT)
    assert not out.finished and out.outputs[0].finish_reason is None


def test_delta_shows_only_what_is_new() -> None:
    request = make_request(output_kind=RequestOutputKind.DELTA)
    c = request.completions[0]
    add(c, 10, "a")
    add(c, 11, "b")
    first = request.make_output().outputs[0]
    assert (first.token_ids, first.text) == ([10, 11], "ab")
    empty = request.make_output().outputs[0]
    assert (empty.token_ids, empty.text) == ([], "")
    add(c, 12, "c")
    c.seq.status = SequenceStatus.FINISHED_LENGTH
    last = request.make_output()
    assert (last.outputs[0].token_ids, last.outputs[0].text) == ([12], "c")
    assert last.finished and last.outputs[0].finish_reason == "length"


def test_final_only_shows_one_output_when_finished() -> None:
    request = make_request(n=2, output_kind=RequestOutputKind.FINAL_ONLY)
    first, second = request.completions
    add(first, 10, "a")
    add(second, 20, "x")
    first.seq.status = SequenceStatus.FINISHED_STOPPED
    assert request.make_output() is None
    second.seq.status = SequenceStatus.FINISHED_LENGTH
    out = request.make_output()
    assert out.finished
    assert [(o.index, o.token_ids, o.finish_reason) for o in out.outputs] == [
        (0, [10], "stop"),
        (1, [20], "length"),
    ]


def test_not_finished_until_all_n_completions_exist() -> None:
    """Before the first token only completion 0 exists; the others fork from it."""
    request = Request("r", None, PROMPT, SamplingParams(n=2))
    request.completions.append(Completion(0, Sequence(0, PROMPT, 4), None))
    request.completions[0].seq.status = SequenceStatus.FINISHED_ABORTED
    assert not request.finished


@pytest.mark.parametrize("kind", [RequestOutputKind.CUMULATIVE, RequestOutputKind.DELTA])
def test_text_that_may_start_a_stop_string_is_held_back(kind: RequestOutputKind) -> None:
    """stop="STOP": the last 3 characters wait until the sequence ends; shown text never
    shrinks, and in delta mode each character is sent once."""
    request = make_request(stop=["STOP", "X"], output_kind=kind)
    c = request.completions[0]
    texts = []
    for token, piece in enumerate(["ab", "cdef", "g", "hi"]):
        add(c, token, piece)
        texts.append(request.make_output().outputs[0].text)
    c.seq.status = SequenceStatus.FINISHED_LENGTH
    texts.append(request.make_output().outputs[0].text)
    if kind is RequestOutputKind.DELTA:
        assert texts == ["", "abc", "d", "ef", "ghi"]
    else:
        assert texts == ["", "abc", "abcd", "abcdef", "abcdefghi"]


def test_include_stop_str_in_output_holds_nothing_back() -> None:
    request = make_request(stop=["STOP"], include_stop_str_in_output=True)
    add(request.completions[0], 10, "abcdef")
    assert request.make_output().outputs[0].text == "abcdef"


def test_apply_stop_truncates_the_text_and_records_the_reason() -> None:
    request = make_request(stop=["ST"])
    c = request.completions[0]
    add(c, 10, "abcST")
    c.apply_stop(StopDecision(SequenceStatus.FINISHED_STOPPED, "ST", truncate_text_to=3))
    c.seq.status = SequenceStatus.FINISHED_STOPPED
    out = request.make_output().outputs[0]
    assert (out.text, out.stop_reason, out.finish_reason) == ("abc", "ST", "stop")


@pytest.mark.parametrize(
    "status, error, reason",
    [
        (SequenceStatus.FINISHED_ABORTED, RuntimeError("boom"), "error"),
        (SequenceStatus.RUNNING, RuntimeError("boom"), "error"),
        (SequenceStatus.FINISHED_STOPPED, RuntimeError("boom"), "stop"),
        (SequenceStatus.FINISHED_LENGTH, RuntimeError("boom"), "length"),
        (SequenceStatus.FINISHED_ABORTED, None, "abort"),
    ],
)
def test_finish_reason_error_only_for_sequences_the_failure_ended(status, error, reason) -> None:
    request = make_request()
    request.completions[0].seq.status = status
    request.error = error
    out = request.make_output()
    assert out.outputs[0].finish_reason == reason
    assert out.error is error and out.finished is (error is not None or status.is_finished)


def test_logprobs_and_cumulative_logprob_only_when_asked() -> None:
    request = make_request(output_kind=RequestOutputKind.DELTA)
    c = request.completions[0]
    add(c, 10, "")
    out = request.make_output().outputs[0]
    assert (out.logprobs, out.cumulative_logprob) == (None, None)
    c.logprobs = [{10: Logprob(-0.5, 1)}, {11: Logprob(-1.0, 2)}]
    c.cumulative_logprob = -1.5
    add(c, 11, "")
    out = request.make_output().outputs[0]
    assert out.logprobs == [{11: Logprob(-1.0, 2)}] and out.cumulative_logprob == -1.5


@pytest.mark.parametrize("kind", [RequestOutputKind.CUMULATIVE, RequestOutputKind.DELTA])
def test_prompt_logprobs_all_or_unsent_and_copied(kind: RequestOutputKind) -> None:
    request = make_request(output_kind=kind)
    assert request.make_output().prompt_logprobs is None
    request.prompt_logprobs = [None, {6: Logprob(-1.0, 1)}]
    first = request.make_output().prompt_logprobs
    assert first == [None, {6: Logprob(-1.0, 1)}]
    request.prompt_logprobs.append({7: Logprob(-2.0, 3)})
    assert len(first) == 2  # a copy: the request's list grows on
    second = request.make_output().prompt_logprobs
    if kind is RequestOutputKind.DELTA:
        assert second == [{7: Logprob(-2.0, 3)}]
        assert request.make_output().prompt_logprobs is None
    else:
        assert second == request.prompt_logprobs


def test_add_text_without_a_detokenizer_adds_nothing() -> None:
    c = make_request().completions[0]
    assert c.add_text(10) == 0 and c.text == ""
