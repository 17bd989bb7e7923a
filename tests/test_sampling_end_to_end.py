"""Sampling features end to end through LLM and LLMEngine (the Sampler alone is tested in
tests/layers/test_sampler.py). References: transformers' `generate` and logits on tiny
random checkpoints; the definitions of top-k, top-p and min-p on transformers'
probabilities; and, on the default model, the same batch's unconstrained greedy output."""

import itertools
from collections.abc import Callable

import pytest
import torch
from torch import nn

from pagedllm import LLM, SamplingParams
from pagedllm.outputs import CompletionOutput, RequestOutput
from pagedllm.sample.logits_processors import LogitsProcessor
from pagedllm.sampling_params import RequestOutputKind

LLAMA = "llama-gqa-llama3"
MAX_TOKENS = 16
TINY_KWARGS = dict(skip_tokenizer_init=True, dtype="float32", device="cpu", max_model_len=256)
PROMPT = "The capital of France is"
ONE_WORD = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]


class BanToken(LogitsProcessor):
    """Bans extra_args["ban"] for the requests that set it (the README's example)."""

    def __init__(self, vocab_size, device, is_pin_memory=False):
        super().__init__(vocab_size, device, is_pin_memory)
        self.bans: dict[int, int] = {}

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update) -> None:
        if batch_update is None:
            return
        for index, params, _prompt, _output in batch_update.added:
            ban = (params.extra_args or {}).get("ban")
            if ban is None:
                self.bans.pop(index, None)
            else:
                self.bans[index] = ban
        for index in batch_update.removed:
            self.bans.pop(index, None)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for row, token in self.bans.items():
            logits[row, token] = float("-inf")
        return logits


class StrictBanToken(BanToken):
    """BanToken that rejects a request whose extra_args["ban"] is not an int."""

    @classmethod
    def validate_params(cls, params: SamplingParams) -> None:
        ban = (params.extra_args or {}).get("ban")
        if ban is not None and not isinstance(ban, int):
            raise ValueError(f"extra_args['ban'] must be a token id (int), got {ban!r}")


class NotAProcessor:
    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return logits


# Fixtures and helpers.


@pytest.fixture(scope="module")
def tiny_llm(tiny_model_path: Callable[[str], str]) -> Callable[..., LLM]:
    """(name, **engine kwargs) -> an LLM on that tiny model, built once per module."""
    llms: dict[str, LLM] = {}

    def get(name: str = LLAMA, **kwargs: object) -> LLM:
        key = repr((name, sorted(kwargs.items())))
        if key not in llms:
            kwargs = {"num_kv_blocks": 128, **TINY_KWARGS, **kwargs}
            llms[key] = LLM(tiny_model_path(name), **kwargs)
        return llms[key]

    return get


@pytest.fixture(scope="module")
def default_llm() -> LLM:
    return LLM(num_kv_blocks=48, max_model_len=512)


def greedy(max_tokens: int = MAX_TOKENS, **kwargs: object) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, **kwargs)


def as_prompts(token_lists: list[list[int]]) -> list[dict]:
    return [{"prompt_token_ids": ids} for ids in token_lists]


def completions(llm: LLM, prompts: list, params: list[SamplingParams]) -> list[CompletionOutput]:
    """The first completion of each request, generated in one batch."""
    return [out.outputs[0] for out in llm.generate(prompts, params, use_tqdm=False)]


def hf_generate_greedy(
    model: nn.Module, prompt: list[int], max_new_tokens: int, **kw: object
) -> list[int]:
    """transformers' `generate(do_sample=False, **kw)` for one prompt, never stopping at EOS."""
    ids = torch.tensor([prompt])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=None,
        pad_token_id=0,
        **kw,
    )
    return out[0, len(prompt) :].tolist()


def hf_next_token_logits(model: nn.Module, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """transformers' logits [len(tokens), V] at the positions that predict each of `tokens`."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens[:-1]])).logits[0]
    return logits[len(prompt) - 1 :]


def expected_logprobs(ref: torch.Tensor, token: int, num: int) -> dict[int, tuple[float, int]]:
    """token -> (logprob, rank) for the chosen token and the top `num` of `ref` [V]."""
    rank = int((ref > ref[token]).sum()) + 1
    top = ref.topk(num)
    expected = {token: (ref[token].item(), rank)}
    for r, (tid, lp) in enumerate(zip(top.indices.tolist(), top.values.tolist()), start=1):
        expected[tid] = (lp, r)
    return expected


def assert_logprobs_equal(completion: CompletionOutput, refs: torch.Tensor, num: int) -> None:
    """Each position's logprobs dict holds the chosen token and the top `num` of refs [N, V],
    with their logprobs (to 1e-4) and ranks."""
    chosen = []
    for token, logprobs, ref in zip(completion.token_ids, completion.logprobs, refs, strict=True):
        expected = expected_logprobs(ref, token, num)
        assert sorted(logprobs) == sorted(expected)
        for tid, lp in logprobs.items():
            assert lp.logprob == pytest.approx(expected[tid][0], abs=1e-4)
            assert lp.rank == expected[tid][1]
        chosen.append(logprobs[token].logprob)
    assert completion.cumulative_logprob == pytest.approx(sum(chosen), abs=1e-4)


# 1. Repetition penalty.


@pytest.mark.parametrize("name", [LLAMA, "qwen3"])
def test_repetition_penalty_greedy_matches_transformers_generate(
    name, tiny_llm, hf_model, hf_greedy, spread_prompts
) -> None:
    """Reference: transformers' `generate(do_sample=False, repetition_penalty=1.3)`, which
    penalizes prompt and output tokens like vLLM; unpenalized rows share the batch."""
    prompts = spread_prompts[:5]
    penalized = [hf_generate_greedy(hf_model(name), p, 24, repetition_penalty=1.3) for p in prompts]
    plain = [g.token_ids for g in hf_greedy(name, prompts, 24)]
    assert penalized != plain, "the penalty must change some tokens for this test to bite"
    params = SamplingParams(temperature=0, repetition_penalty=1.3, max_tokens=24, ignore_eos=True)
    outputs = completions(
        tiny_llm(name), as_prompts(prompts * 2), [params] * 5 + [greedy(24, ignore_eos=True)] * 5
    )
    assert [c.token_ids for c in outputs] == penalized + plain


# 2. Sample logprobs.


def test_raw_sample_logprobs_equal_transformers_log_softmax(
    tiny_llm, hf_model, spread_prompts
) -> None:
    """Reference: transformers' log_softmax of its logits at each sampled position: the
    chosen token's logprob and rank, and the top-5 ids, logprobs and ranks, to 1e-4."""
    prompts = spread_prompts[1:4]
    params = SamplingParams(temperature=1.0, seed=3, max_tokens=12, ignore_eos=True, logprobs=5)
    outputs = completions(tiny_llm(LLAMA), as_prompts(prompts), [params] * 3)
    ranks = []
    for prompt, completion in zip(prompts, outputs, strict=True):
        logits = hf_next_token_logits(hf_model(LLAMA), prompt, completion.token_ids)
        assert_logprobs_equal(completion, logits.log_softmax(-1), 5)
        ranks += [lp[t].rank for lp, t in zip(completion.logprobs, completion.token_ids)]
    assert min(ranks) <= 5 < max(ranks), "cover chosen tokens inside and outside the top 5"


def test_processed_logprobs_equal_log_softmax_of_logits_over_temperature(
    tiny_llm, hf_model, spread_prompts
) -> None:
    """Reference: the formula log_softmax(logits / 0.5) on transformers' logits."""
    llm = tiny_llm(LLAMA, logprobs_mode="processed_logprobs")
    prompts = spread_prompts[2:4]
    params = SamplingParams(temperature=0.5, seed=8, max_tokens=10, ignore_eos=True, logprobs=5)
    outputs = completions(llm, as_prompts(prompts), [params] * 2)
    for prompt, completion in zip(prompts, outputs, strict=True):
        logits = hf_next_token_logits(hf_model(LLAMA), prompt, completion.token_ids)
        assert_logprobs_equal(completion, (logits / 0.5).log_softmax(-1), 5)


# 3. n > 1.


def test_n4_seeded_is_reproducible_distinct_and_frees_all_blocks(tiny_llm, spread_prompts):
    """Reference: a second run with the same seed (with other requests in its batch)."""
    llm = tiny_llm(LLAMA)
    params = SamplingParams(n=4, temperature=1.0, seed=21, max_tokens=12, ignore_eos=True)
    prompts = as_prompts(spread_prompts[2:4])
    first = llm.generate(prompts, params, use_tqdm=False)
    noise = SamplingParams(temperature=0.7, max_tokens=20, ignore_eos=True)
    second = llm.generate(
        prompts + as_prompts(spread_prompts[5:6]), [params] * 2 + [noise], use_tqdm=False
    )
    for a, b in zip(first, second[:2], strict=True):
        assert [c.index for c in a.outputs] == [0, 1, 2, 3]
        assert [len(c.token_ids) for c in a.outputs] == [12] * 4
        assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]
        assert len({tuple(c.token_ids) for c in a.outputs}) == 4
    engine = llm.llm_engine
    assert not engine.has_unfinished_requests()
    assert engine.block_manager.num_free_blocks == engine.num_blocks
    engine.block_manager.check_invariants([])


# 4. Custom logits processors.


@pytest.mark.parametrize("spec", [BanToken, f"{__name__}:BanToken"], ids=["class", "string"])
def test_ban_token_processor_matches_transformers_suppress_tokens(
    spec, tiny_llm, hf_model, hf_greedy, spread_prompts
) -> None:
    """Reference: transformers' greedy `generate(suppress_tokens=[t])` for the request that
    sets extra_args, plain greedy `generate` for the two that do not (same batch)."""
    prompt = spread_prompts[3]
    (plain,) = hf_greedy(LLAMA, [prompt], MAX_TOKENS)
    banned = plain.token_ids[0]
    suppressed = hf_generate_greedy(hf_model(LLAMA), prompt, MAX_TOKENS, suppress_tokens=[banned])
    assert banned not in suppressed
    llm = tiny_llm(LLAMA, logits_processors=(spec,))
    params = [greedy(ignore_eos=True), greedy(ignore_eos=True, extra_args={"ban": banned})]
    outputs = completions(llm, as_prompts([prompt] * 3), params + params[:1])
    assert [c.token_ids for c in outputs] == [plain.token_ids, suppressed, plain.token_ids]


@pytest.mark.parametrize(
    "spec, message",
    [
        (f"{__name__}:MissingProcessor", r"cannot load logits processor '.*:MissingProcessor'"),
        ("no_such_module_for_pagedllm:Ban", "cannot load logits processor"),
        ("NoColonOrDot", "must be 'module:Class' or a class"),
        (NotAProcessor, "must be a subclass of LogitsProcessor"),
    ],
)
def test_broken_processor_raises_at_construction(spec, message, tiny_model_path) -> None:
    """Reference: the loader's contract, a ValueError naming the bad processor."""
    with pytest.raises(ValueError, match=message):
        LLM(tiny_model_path(LLAMA), logits_processors=[spec], num_kv_blocks=16, **TINY_KWARGS)


def test_validate_params_rejects_request_at_add(tiny_llm, hf_greedy, spread_prompts) -> None:
    """Reference: StrictBanToken.validate_params; the engine stays idle and keeps serving."""
    llm = tiny_llm(LLAMA, logits_processors=(StrictBanToken,))
    engine, prompt = llm.llm_engine, spread_prompts[2]
    bad = greedy(extra_args={"ban": "x"})
    message = r"extra_args\['ban'\] must be a token id \(int\), got 'x'"
    with pytest.raises(ValueError, match=message):
        engine.add_request("bad", {"prompt_token_ids": prompt}, bad)
    with pytest.raises(ValueError, match=message):
        llm.generate(as_prompts([prompt] * 2), [greedy(), bad], use_tqdm=False)
    assert not engine.has_unfinished_requests()
    assert engine.block_manager.num_free_blocks == engine.num_blocks
    (output,) = completions(llm, as_prompts([prompt]), [greedy(ignore_eos=True)])
    assert output.token_ids == hf_greedy(LLAMA, [prompt], MAX_TOKENS)[0].token_ids


# 5. Token constraints and stopping on the default model.


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


def test_ignore_eos_generates_exactly_max_tokens(default_llm) -> None:
    """Reference: the same batch's greedy answer, which stops at EOS; ignoring it continues
    the same tokens to max_tokens."""
    outputs = default_llm.chat([ONE_WORD] * 2, [greedy(48), greedy(20, ignore_eos=True)])
    plain, ignored = [out.outputs[0] for out in outputs]
    assert plain.finish_reason == "stop" and len(plain.token_ids) < 20
    assert len(ignored.token_ids) == 20 and ignored.finish_reason == "length"
    assert ignored.token_ids[: len(plain.token_ids)] == plain.token_ids


# 6. The sampled distribution's support.

NUM_SEEDS = 50


def first_tokens(llm: LLM, prompts: list[list[int]], **kwargs: object) -> list[list[int]]:
    """Per prompt, the first token of NUM_SEEDS requests seeded 0..NUM_SEEDS-1, one batch."""
    params = [
        SamplingParams(temperature=1.0, seed=seed, max_tokens=1, **kwargs)
        for seed in range(NUM_SEEDS)
    ]
    repeated = [p for p in prompts for _ in range(NUM_SEEDS)]
    tokens = [c.token_ids[0] for c in completions(llm, as_prompts(repeated), params * len(prompts))]
    return [tokens[i : i + NUM_SEEDS] for i in range(0, len(tokens), NUM_SEEDS)]


def top_k_support(probs: torch.Tensor, k: float) -> set[int]:
    return set(probs.topk(int(k)).indices.tolist())


def top_p_support(probs: torch.Tensor, p: float) -> set[int]:
    """The nucleus: tokens whose more likely tokens hold less than p (transformers' TopP);
    the 1e-5 margin absorbs float differences between the two implementations."""
    sorted_probs, order = probs.sort(descending=True)
    mass_above = sorted_probs.cumsum(0) - sorted_probs
    return set(order[mass_above < p + 1e-5].tolist())


def min_p_support(probs: torch.Tensor, min_p: float) -> set[int]:
    return set((probs >= min_p * probs.max() - 1e-6).nonzero()[:, 0].tolist())


@pytest.fixture(scope="module")
def support_case(tiny_llm, hf_model, spread_prompts) -> tuple:
    """(prompts, transformers' next-token probabilities [V] per prompt, the unfiltered
    seeded samples per prompt)."""
    prompts = spread_prompts[:4]
    with torch.no_grad():
        probs = [hf_model(LLAMA)(torch.tensor([p])).logits[0, -1].softmax(-1) for p in prompts]
    return prompts, probs, first_tokens(tiny_llm(LLAMA), prompts)


@pytest.mark.parametrize(
    "name, value, support",
    [("top_k", 3, top_k_support), ("top_p", 0.5, top_p_support), ("min_p", 0.3, min_p_support)],
)
def test_samples_stay_in_the_support_of_transformers_probs(
    name, value, support, support_case, tiny_llm
) -> None:
    """Reference: top-k, the top-p nucleus and the min-p set computed on transformers'
    probabilities; 200 seeded samples at temperature 1 must all fall inside, while the same
    seeds without the filter fall outside."""
    prompts, probs, unfiltered = support_case
    samples = first_tokens(tiny_llm(LLAMA), prompts, **{name: value})
    for row_probs, tokens, free in zip(probs, samples, unfiltered, strict=True):
        allowed = support(row_probs, value)
        assert set(tokens) <= allowed
        assert len(set(tokens)) >= 2, "the filtered request must still sample"
        assert not set(free) <= allowed, "the filter must exclude some unfiltered samples"


# 7. Output kinds.


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
