"""Sampling features end to end through LLM on tiny random checkpoints (the Sampler alone is
tested in tests/sample/test_sampler.py; token constraints and output kinds on the default
model in tests/test_sampling_text_constraints.py). References: transformers' `generate` and
logits; the definitions of top-k, top-p and min-p on transformers' probabilities."""

import pytest
import torch
from torch import nn

from pagedllm import LLM, SamplingParams
from pagedllm.outputs import CompletionOutput
from tests.devices import DEVICES
from tests.sampling_helpers import (
    LLAMA,
    as_prompts,
    completions,
    greedy,
    hf_generate_greedy,
    tiny_llm,
)

__all__ = ["tiny_llm"]  # a fixture this module's tests use


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


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", [LLAMA, "qwen3"])
def test_repetition_penalty_greedy_matches_transformers_generate(
    name, device, tiny_llm, hf_model, hf_greedy, spread_prompts
) -> None:
    """Reference: transformers' `generate(do_sample=False, repetition_penalty=1.3)`, which
    penalizes prompt and output tokens like vLLM; unpenalized rows share the batch."""
    prompts = spread_prompts[:5]
    penalized = [hf_generate_greedy(hf_model(name), p, 24, repetition_penalty=1.3) for p in prompts]
    plain = [g.token_ids for g in hf_greedy(name, prompts, 24)]
    assert penalized != plain, "the penalty must change some tokens for this test to bite"
    params = SamplingParams(temperature=0, repetition_penalty=1.3, max_tokens=24, ignore_eos=True)
    outputs = completions(
        tiny_llm(name, device=device),
        as_prompts(prompts * 2),
        [params] * 5 + [greedy(24, ignore_eos=True)] * 5,
    )
    assert [c.token_ids for c in outputs] == penalized + plain


# 2. Sample logprobs.


@pytest.mark.parametrize("device", DEVICES)
def test_raw_sample_logprobs_equal_transformers_log_softmax(
    device, tiny_llm, hf_model, spread_prompts
) -> None:
    """Reference: transformers' log_softmax of its logits at each sampled position: the
    chosen token's logprob and rank, and the top-5 ids, logprobs and ranks, to 1e-4."""
    prompts = spread_prompts[1:4]
    params = SamplingParams(temperature=1.0, seed=3, max_tokens=12, ignore_eos=True, logprobs=5)
    outputs = completions(tiny_llm(LLAMA, device=device), as_prompts(prompts), [params] * 3)
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


@pytest.mark.parametrize("device", DEVICES)
def test_n4_seeded_is_reproducible_distinct_and_frees_all_blocks(
    device, tiny_llm, spread_prompts
) -> None:
    """Reference: a second run with the same seed (with other requests in its batch)."""
    llm = tiny_llm(LLAMA, device=device)
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
