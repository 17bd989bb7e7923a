"""Token constraints, stopping and output kinds end to end through LLM and LLMEngine on the
default model. References: the same batch's unconstrained greedy output (what a constraint
must change), and the FINAL_ONLY output of an identical seeded request (what the DELTA
pieces add up to and the CUMULATIVE outputs grow into)."""

import itertools

import pytest

from pagedllm import LLM, SamplingParams
from pagedllm.outputs import CompletionOutput, RequestOutput
from pagedllm.sampling_params import RequestOutputKind

PROMPT = "The capital of France is"
ONE_WORD = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]


@pytest.fixture(scope="module")
def default_llm() -> LLM:
    return LLM(num_kv_blocks=48, max_model_len=512, quantization="none", dtype="float32")


def greedy(max_tokens: int = 16, **kwargs: object) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, **kwargs)


def completions(llm: LLM, prompts: list, params: list[SamplingParams]) -> list[CompletionOutput]:
    """The first completion of each request, generated in one batch."""
    return [out.outputs[0] for out in llm.generate(prompts, params, use_tqdm=False)]


# Token constraints and stopping on the default model.


def test_bad_words_ban_the_paris_that_greedy_says(default_llm) -> None:
    """Reference: the same batch's unconstrained greedy output says " Paris"."""
    plain, banned = completions(
        default_llm, [PROMPT] * 2, [greedy(12), greedy(12, bad_words=[" Paris"])]
    )
    assert "Paris" in plain.text
    assert "Paris" not in banned.text
    paris = default_llm.get_tokenizer().encode(" Paris", add_special_tokens=False)
    assert paris[0] in plain.token_ids and paris[0] not in banned.token_ids


def test_allowed_token_ids_restrict_every_sampled_token(default_llm) -> None:
    """Reference: the allowed set; the same seed without it samples outside the set."""
    allowed = default_llm.get_tokenizer().encode(" Paris is the city of", add_special_tokens=False)
    params = dict(temperature=1.0, seed=4, max_tokens=12)
    free, limited = completions(
        default_llm,
        [PROMPT] * 2,
        [SamplingParams(**params), SamplingParams(**params, allowed_token_ids=allowed)],
    )
    assert not set(free.token_ids) <= set(allowed)
    assert len(limited.token_ids) == 12 and set(limited.token_ids) <= set(allowed)


def test_logit_bias_plus_100_makes_every_token_that_token(default_llm) -> None:
    """Reference: the definition; +100 outweighs every logit, even when sampling."""
    (banana,) = default_llm.get_tokenizer().encode(" banana", add_special_tokens=False)
    params = dict(temperature=1.0, seed=2, max_tokens=8)
    free, biased = completions(
        default_llm,
        [PROMPT] * 2,
        [SamplingParams(**params), SamplingParams(**params, logit_bias={banana: 100})],
    )
    assert banana not in free.token_ids
    assert biased.token_ids == [banana] * 8


def test_min_tokens_holds_off_eos(default_llm) -> None:
    """Reference: the same batch's greedy answer, which ends with EOS before min_tokens."""
    outputs = default_llm.chat([ONE_WORD] * 2, [greedy(48), greedy(48, min_tokens=12)])
    plain, held = [out.outputs[0] for out in outputs]
    assert plain.finish_reason == "stop" and len(plain.token_ids) < 12
    eos = plain.token_ids[-1]
    assert len(held.token_ids) >= 12
    assert eos not in held.token_ids[:12]


def test_min_tokens_holds_off_a_stop_string(default_llm) -> None:
    """Reference: the same batch's greedy text; stop "." ends it at 2 tokens without
    min_tokens, and the "." before min_tokens stays in the text with it."""
    plain, stopped, held = completions(
        default_llm,
        [PROMPT] * 3,
        [greedy(), greedy(stop=["."]), greedy(stop=["."], min_tokens=6)],
    )
    assert stopped.text == plain.text[: plain.text.index(".")]
    assert len(held.token_ids) >= 6
    assert held.token_ids == plain.token_ids[: len(held.token_ids)]
    assert held.text.startswith(plain.text[: plain.text.index(".") + 1])


@pytest.mark.parametrize("include", [False, True])
def test_stop_string_cuts_the_greedy_text(default_llm, include: bool) -> None:
    """Reference: the same batch's greedy text cut at the stop string (spanning tokens),
    with it when include_stop_str_in_output."""
    stop = "answer is:"
    plain, stopped = completions(
        default_llm,
        [PROMPT] * 2,
        [greedy(24), greedy(24, stop=[stop], include_stop_str_in_output=include)],
    )
    end = plain.text.index(stop) + (len(stop) if include else 0)
    assert stopped.text == plain.text[:end]
    assert (stopped.finish_reason, stopped.stop_reason) == ("stop", stop)
    tokenizer = default_llm.get_tokenizer()
    decoded = [tokenizer.decode(plain.token_ids[:k]) for k in range(1, 25)]
    num_tokens = next(k for k, text in enumerate(decoded, start=1) if stop in text)
    assert num_tokens > 2 and stopped.token_ids == plain.token_ids[:num_tokens]


@pytest.mark.parametrize("include", [False, True])
def test_a_stop_token_ids_text_is_left_out_unless_included(default_llm, include: bool) -> None:
    """Reference: vLLM's detokenizer, which leaves out the text of the token that stopped
    the answer by its id unless include_stop_str_in_output; the token id stays."""
    (plain,) = completions(default_llm, [PROMPT], [greedy(24)])
    stop_id = plain.token_ids[5]
    first = plain.token_ids.index(stop_id)
    params = greedy(24, stop_token_ids=[stop_id], include_stop_str_in_output=include)
    (stopped,) = completions(default_llm, [PROMPT], [params])
    assert stopped.token_ids == plain.token_ids[: first + 1] and stopped.stop_reason == stop_id
    tokenizer = default_llm.get_tokenizer()
    kept = plain.token_ids[: first + 1] if include else plain.token_ids[:first]
    assert stopped.text == tokenizer.decode(kept)


def test_ignore_eos_generates_exactly_max_tokens(default_llm) -> None:
    """Reference: the same batch's greedy answer, which stops at EOS; ignoring it continues
    the same tokens to max_tokens."""
    outputs = default_llm.chat([ONE_WORD] * 2, [greedy(48), greedy(20, ignore_eos=True)])
    plain, ignored = [out.outputs[0] for out in outputs]
    assert plain.finish_reason == "stop" and len(plain.token_ids) < 20
    assert len(ignored.token_ids) == 20 and ignored.finish_reason == "length"
    assert ignored.token_ids[: len(plain.token_ids)] == plain.token_ids


# Output kinds.


def test_output_kinds_through_step_agree_with_final_only(default_llm) -> None:
    """Reference: the FINAL_ONLY output of an identical seeded request in the same batch:
    the DELTA pieces add up to it and the CUMULATIVE outputs grow into it. The stop string
    makes the engine hold back text, and may end one completion before the other."""
    engine = default_llm.llm_engine
    base = dict(n=2, temperature=0.8, seed=5, max_tokens=16, logprobs=1, stop=[" of"])
    for kind in RequestOutputKind:
        engine.add_request(kind.name, PROMPT, SamplingParams(**base, output_kind=kind))
    history: dict[str, list[RequestOutput]] = {kind.name: [] for kind in RequestOutputKind}
    while engine.has_unfinished_requests():
        for out in engine.step():
            history[out.request_id].append(out)
    (final,) = history["FINAL_ONLY"]
    assert final.finished and [c.index for c in final.outputs] == [0, 1]
    for kind in ("DELTA", "CUMULATIVE"):
        finished = [out.finished for out in history[kind]]
        assert len(finished) > 3 and finished == [False] * (len(finished) - 1) + [True]
    for expected in final.outputs:
        assert_deltas_add_up(pieces(history["DELTA"], expected.index), expected)
        assert_grows_into(pieces(history["CUMULATIVE"], expected.index), expected)


def pieces(outputs: list[RequestOutput], index: int) -> list[CompletionOutput]:
    return [c for out in outputs for c in out.outputs if c.index == index]


def assert_same_logprobs(ours: list[dict], reference: list[dict]) -> None:
    """Same ids and ranks; values to 1e-5, since identical prompts in one batch may differ
    in the last float bits."""
    assert [{t: lp.rank for t, lp in d.items()} for d in ours] == [
        {t: lp.rank for t, lp in d.items()} for d in reference
    ]
    values = [lp.logprob for d in ours for lp in d.values()]
    assert values == pytest.approx([lp.logprob for d in reference for lp in d.values()], abs=1e-5)


def assert_deltas_add_up(deltas: list[CompletionOutput], final: CompletionOutput) -> None:
    assert "".join(d.text for d in deltas) == final.text
    assert sum((d.token_ids for d in deltas), []) == final.token_ids
    assert_same_logprobs(sum((d.logprobs for d in deltas), []), final.logprobs)
    assert deltas[-1].finish_reason == final.finish_reason
    assert [len(d.token_ids) for d in deltas if d.token_ids] == [1] * len(final.token_ids)


def assert_grows_into(outputs: list[CompletionOutput], final: CompletionOutput) -> None:
    """Each output extends the one before by the step's token, until the completion ends."""
    for before, after in itertools.pairwise(outputs):
        grown = int(before.finish_reason is None)
        assert len(after.token_ids) == len(before.token_ids) + grown
        assert after.token_ids[: len(before.token_ids)] == before.token_ids
        assert after.text.startswith(before.text)
        assert after.logprobs[: len(before.logprobs)] == before.logprobs
    last = outputs[-1]
    assert (last.text, last.token_ids, last.finish_reason) == (
        final.text,
        final.token_ids,
        final.finish_reason,
    )
    assert_same_logprobs(last.logprobs, final.logprobs)
    assert last.cumulative_logprob == pytest.approx(final.cumulative_logprob, abs=1e-4)
