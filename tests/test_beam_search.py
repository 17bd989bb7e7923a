"""pagedllm/beam_search.py and LLM.beam_search. References: vLLM's definition of the
search (candidates: a beam's 2 x beam_width most likely next tokens; rank: cumulative
logprob over length ** length_penalty, the prompt counted, a final EOS not; EOS ends a
beam), run by hand on a fake model's fixed logprobs and, on a tiny random model, on
transformers' float32 logits."""

import asyncio
import math

import pytest
import torch
import transformers

from pagedllm import LLM, Logprob
from pagedllm.beam_search import beam_search, beam_search_async, get_beam_search_score
from pagedllm.outputs import CompletionOutput, RequestOutput
from pagedllm.sampling_params import BeamSearchParams

EOS = 0


def fake_generate(table: dict[tuple[int, ...], dict[int, float]], calls: list):
    """An engine whose next-token logprobs depend on the sequence so far (`table`, with a
    default for sequences it does not list); it records each step's batch."""

    def generate(prompts: list[dict], params) -> list[RequestOutput]:
        calls.append([tuple(p["prompt_token_ids"]) for p in prompts])
        outputs = []
        for p in prompts:
            ids = tuple(p["prompt_token_ids"])
            logprobs = table.get(ids, {5: math.log(0.5), 6: math.log(0.3), EOS: math.log(0.2)})
            top = dict(sorted(logprobs.items(), key=lambda kv: -kv[1])[: params.logprobs])
            candidates = {t: Logprob(lp, rank) for rank, (t, lp) in enumerate(top.items(), 1)}
            completion = CompletionOutput(0, "", [next(iter(top))], None, [candidates])
            outputs.append(
                RequestOutput(str(len(outputs)), None, list(ids), None, [completion], True)
            )
        return outputs

    return generate


def test_score_is_vllms() -> None:
    assert get_beam_search_score([1, 2, 3], -6.0, EOS) == -2.0
    assert get_beam_search_score([1, 2, EOS], -6.0, EOS) == -3.0  # a final EOS is not counted
    assert get_beam_search_score([1, 2, 3, 5], -8.0, {9, 4}, length_penalty=0.5) == -4.0


def test_search_keeps_the_best_beams_and_ends_them_at_eos() -> None:
    """Prompt [1]: step 1 candidates 5 (p .5), 6 (.3), EOS (.2); with width 2 the EOS
    child is finished at once and the two live beams grow by the default table."""
    calls: list = []
    params = BeamSearchParams(beam_width=2, max_tokens=2)
    (out,) = beam_search(fake_generate({}, calls), [[1]], params, {EOS}, 100, str)
    assert calls == [[(1,)], [(1, 5), (1, 6)]]
    scored = {tuple(s.tokens): (s.cum_logprob, s.finish_reason, s.text) for s in out.sequences}
    # Candidates: [1, EOS] -1.609/1; [1,5,5] -1.386/3; [1,5,6] -1.897/3; [1,6,5] -1.897/3 ...
    assert list(scored) == [(1, 5, 5), (1, 5, 6)]
    assert scored[(1, 5, 5)] == (pytest.approx(2 * math.log(0.5)), "length", "[1, 5, 5]")
    assert all(len(s.logprobs) == 2 for s in out.sequences)


def test_ignore_eos_keeps_eos_beams_growing() -> None:
    calls: list = []
    params = BeamSearchParams(beam_width=3, max_tokens=2, ignore_eos=True)
    (out,) = beam_search(fake_generate({}, calls), [[1]], params, {EOS}, 100, str)
    assert (1, EOS) in calls[1]
    assert all(s.finish_reason == "length" for s in out.sequences)


def test_a_beam_at_max_model_len_stops_growing() -> None:
    calls: list = []
    params = BeamSearchParams(beam_width=1, max_tokens=5)
    (out,) = beam_search(fake_generate({}, calls), [[1, 2]], params, {EOS}, 4, str)
    assert len(calls) == 2 and out.sequences[0].tokens == [1, 2, 5, 5]


def test_length_penalty_favours_longer_finished_beams() -> None:
    """length_penalty 0 ranks by the sum of logprobs, 1 by their mean over the length:
    a short finished beam wins the first only where its sum is the larger."""
    calls: list = []
    raw = BeamSearchParams(beam_width=2, max_tokens=2, length_penalty=0.0)
    (out,) = beam_search(fake_generate({}, calls), [[1]], raw, {EOS}, 100, str)
    assert out.sequences[0].tokens == [1, 5, 5]  # -1.386 > [1, EOS]'s -1.609
    table = {(1,): {EOS: math.log(0.4), 5: math.log(0.35), 6: math.log(0.25)}}
    (out,) = beam_search(fake_generate(table, []), [[1]], raw, {EOS}, 100, str)
    assert out.sequences[0].tokens == [1, EOS]  # -0.916 > -1.05 - 0.69
    mean = BeamSearchParams(beam_width=2, max_tokens=2, length_penalty=1.0)
    (out,) = beam_search(fake_generate(table, []), [[1]], mean, {EOS}, 100, str)
    assert out.sequences[0].tokens == [1, 5, 5]  # -1.74 / 3 > -0.916 / 1


@pytest.mark.parametrize(
    "kwargs", [{"beam_width": 0}, {"max_tokens": 0}, {"temperature": -1.0}, {"beam_width": 1.5}]
)
def test_params_are_checked(kwargs: dict) -> None:
    with pytest.raises((ValueError, TypeError)):
        BeamSearchParams(**{"beam_width": 2, "max_tokens": 4, **kwargs})


def reference_search(model, prompt: list[int], width: int, steps: int, eos: int) -> list:
    """The definition on transformers' float32 logits: (tokens, cum_logprob) best first."""
    live, done = [(prompt, 0.0)], []
    for _ in range(steps):
        grown = []
        for tokens, cum in live:
            with torch.no_grad():
                logits = model(torch.tensor([tokens])).logits[0, -1].float()
            logprobs = torch.log_softmax(logits, -1)
            values, ids = logprobs.topk(2 * width)
            for value, token in zip(values.tolist(), ids.tolist()):
                (done if token == eos else grown).append(([*tokens, token], cum + value))
        live = sorted(grown, key=lambda b: get_beam_search_score(*b, eos), reverse=True)[:width]
    best = sorted(done + live, key=lambda b: get_beam_search_score(*b, eos), reverse=True)
    return best[:width]


def test_llm_beam_search_matches_the_definition_on_transformers(tiny_model_path) -> None:
    path = tiny_model_path("llama-gqa-llama3")
    model = transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
    llm = LLM(path, skip_tokenizer_init=True, dtype="float32", device="cpu", max_model_len=64)
    eos = llm.llm_engine.config.model_config.hf_config.eos_token_id
    prompts = [[3, 14, 15, 9], [2, 7]]
    params = BeamSearchParams(beam_width=3, max_tokens=4)
    outputs = llm.beam_search([{"prompt_token_ids": p} for p in prompts], params)
    for prompt, output in zip(prompts, outputs, strict=True):
        expected = reference_search(model, prompt, 3, 4, eos)
        assert [s.tokens for s in output.sequences] == [t for t, _ in expected]
        cums = [s.cum_logprob for s in output.sequences]
        assert cums == pytest.approx([c for _, c in expected], abs=1e-4)
        assert all(s.text is None for s in output.sequences)  # no tokenizer


def test_llm_beam_search_refuses_more_candidates_than_max_logprobs(tiny_model_path) -> None:
    path = tiny_model_path("llama-gqa-llama3")
    llm = LLM(path, skip_tokenizer_init=True, dtype="float32", device="cpu", max_model_len=64)
    with pytest.raises(ValueError, match="max_logprobs"):
        llm.beam_search([{"prompt_token_ids": [1]}], BeamSearchParams(beam_width=11, max_tokens=2))


def test_llm_beam_search_refuses_a_width_over_max_n(tiny_model_path) -> None:
    """The width is the search's n: LLM(max_n=...) bounds it as it bounds generate's n."""
    path = tiny_model_path("llama-gqa-llama3")
    llm = LLM(path, skip_tokenizer_init=True, device="cpu", max_model_len=64, max_n=2)
    with pytest.raises(ValueError, match=r"beam_width must be at most max_n=2 .*--max-n"):
        llm.beam_search([{"prompt_token_ids": [1]}], BeamSearchParams(beam_width=3, max_tokens=2))


def test_llm_beam_search_steps_carry_each_prompts_cache_salt(
    tiny_model_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As generate does: a prompt dict's cache_salt goes on every request of its search,
    so its blocks are shared with prompts of that salt only."""
    path = tiny_model_path("llama-gqa-llama3")
    llm = LLM(path, skip_tokenizer_init=True, device="cpu", max_model_len=64)
    generate, seen = llm.generate, set()

    def spy(prompts: list[dict], params: object, use_tqdm: bool, lora_request: None) -> list:
        seen.update((p["prompt_token_ids"][0], p.get("cache_salt")) for p in prompts)
        return generate(prompts, params, use_tqdm=use_tqdm)

    monkeypatch.setattr(llm, "generate", spy)
    prompts = [{"prompt_token_ids": [3, 4], "cache_salt": "s"}, {"prompt_token_ids": [5]}]
    llm.beam_search(prompts, BeamSearchParams(beam_width=2, max_tokens=3))
    assert seen == {(3, "s"), (5, None)}


def test_the_async_driver_finds_what_the_sync_one_does() -> None:
    """beam_search_async (the server's) runs the same BeamSearch steps as beam_search."""
    table = {(1,): {EOS: math.log(0.4), 5: math.log(0.35), 6: math.log(0.25)}}
    generate = fake_generate(table, [])

    async def generate_async(prompts: list[dict], params) -> list[RequestOutput]:
        return generate(prompts, params)

    params = BeamSearchParams(beam_width=2, max_tokens=3, length_penalty=0.5)
    (expected,) = beam_search(generate, [[1]], params, {EOS}, 100, str)
    found = asyncio.run(beam_search_async(generate_async, [1], params, {EOS}, 100))
    assert [(s.tokens, s.cum_logprob, s.finish_reason) for s in found.sequences] == [
        (s.tokens, s.cum_logprob, s.finish_reason) for s in expected.sequences
    ]
