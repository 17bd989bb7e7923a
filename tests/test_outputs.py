"""pagedllm/outputs.py: RequestOutput.add merges a request's next DELTA output. Reference:
the fields written out by hand, and the inputs left as they were."""

import copy

from pagedllm.outputs import CompletionOutput, Logprob, RequestOutput


def _delta(pieces: dict[int, tuple[str, list[int]]], **kwargs: object) -> RequestOutput:
    """A DELTA output: per completion index, its new (text, token ids), one logprob each."""
    outputs = [
        CompletionOutput(i, text, ids, -float(len(ids)), [{t: Logprob(-1.0)} for t in ids])
        for i, (text, ids) in pieces.items()
    ]
    return RequestOutput("r", "p", [1, 2], kwargs.pop("prompt_logprobs", None), outputs, **kwargs)


def test_add_appends_each_completions_new_text_tokens_and_logprobs() -> None:
    first = _delta({0: ("Hel", [5]), 1: ("A", [7])}, finished=False, prompt_logprobs=[None])
    second = _delta({0: ("lo", [6, 8]), 1: ("", [])}, finished=False, num_cached_tokens=16)
    third = _delta(
        {1: ("B", [9])}, finished=True, prompt_logprobs=[{2: Logprob(-0.5)}], metrics={"a": 1.0}
    )
    third.outputs[0].finish_reason, third.outputs[0].stop_reason = "stop", "B"
    seconds = copy.deepcopy(second)
    first.add(second)
    first.add(third)
    assert [(c.index, c.text, c.token_ids) for c in first.outputs] == [
        (0, "Hello", [5, 6, 8]),
        (1, "AB", [7, 9]),
    ]
    assert [list(lp) for lp in first.outputs[0].logprobs] == [[5], [6], [8]]
    assert first.outputs[0].cumulative_logprob == -2.0  # the latest piece's: a running sum
    assert (first.outputs[1].finish_reason, first.outputs[1].stop_reason) == ("stop", "B")
    assert first.outputs[0].finish_reason is None
    assert first.prompt_logprobs == [None, {2: Logprob(-0.5)}]
    assert first.finished and first.num_cached_tokens == 0 and first.metrics == {"a": 1.0}
    assert second == seconds  # the merged output is not changed


def test_add_keeps_the_completions_it_had_unchanged() -> None:
    """`accumulate` (the server) merges into copies: the objects merged into stay as
    they were."""
    first = _delta({0: ("a", [1])}, finished=False)
    completion = first.outputs[0]
    merged = copy.copy(first)
    merged.add(_delta({0: ("b", [2])}, finished=True))
    assert (completion.text, completion.token_ids, len(completion.logprobs)) == ("a", [1], 1)
    assert first.outputs == [completion] and not first.finished
    assert merged.outputs[0].text == "ab"
