"""LLMEngine (pagedllm/engine/llm_engine.py) driven step by step on tiny random checkpoints.
Reference: transformers' `generate(do_sample=False)` prompt by prompt, which preemption,
chunked prefill and prefix caching must not change; the block manager's invariants after
every step, and every block free once requests finish or are aborted."""

from dataclasses import dataclass, field

import pytest
import torch

from pagedllm.engine.arg_utils import EngineArgs
from pagedllm.engine.llm_engine import LLMEngine
from pagedllm.outputs import RequestOutput
from pagedllm.sampling_params import RequestOutputKind, SamplingParams

MAX_TOKENS = 32
LLAMA = "llama-gqa-llama3"


def make_engine(path: str, **kwargs: object) -> LLMEngine:
    args = dict(skip_tokenizer_init=True, dtype="float32", device="cpu", max_model_len=256)
    return LLMEngine.from_engine_args(EngineArgs(path, **{**args, **kwargs}))


def greedy(max_tokens: int = MAX_TOKENS) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, logprobs=0)


@dataclass
class Run:
    outputs: dict[str, RequestOutput] = field(default_factory=dict)
    history: dict[str, list[RequestOutput]] = field(default_factory=dict)
    first_token_step: dict[str, int] = field(default_factory=dict)
    num_steps: int = 0


def step_once(engine: LLMEngine, run: Run) -> None:
    """One step; records every output, the finished ones and the step of each request's
    first token, and checks the block manager against the sequences that hold blocks."""
    run.num_steps += 1
    for out in engine.step():
        run.history.setdefault(out.request_id, []).append(out)
        if any(c.token_ids for c in out.outputs):
            run.first_token_step.setdefault(out.request_id, run.num_steps)
        if out.finished:
            run.outputs[out.request_id] = out
    engine.block_manager.check_invariants(engine.scheduler.running)


def run_all(engine: LLMEngine, run: Run | None = None) -> Run:
    run = run or Run()
    while engine.has_unfinished_requests():
        step_once(engine, run)
    assert_all_blocks_free(engine)
    return run


def assert_all_blocks_free(engine: LLMEngine) -> None:
    assert engine.block_manager.num_free_blocks == engine.num_blocks
    engine.block_manager.check_invariants([])


def add_prompts(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams) -> list[str]:
    ids = [f"r{i}" for i in range(len(prompts))]
    for rid, prompt in zip(ids, prompts):
        engine.add_request(rid, {"prompt_token_ids": prompt}, params)
    return ids


def assert_matches_reference(run: Run, ids: list[str], reference: list) -> None:
    for rid, ref in zip(ids, reference, strict=True):
        ref.assert_matches(run.outputs[rid].outputs[0])


@pytest.mark.parametrize("name", [LLAMA, "qwen3", "qwen3-moe"])
def test_preemption_keeps_transformers_greedy(name, tiny_model_path, hf_greedy, spread_prompts):
    """17 blocks of 16 hold 272 tokens; the 8 requests need ~950, so some are preempted and
    recomputed."""
    engine = make_engine(tiny_model_path(name), num_kv_blocks=17)
    ids = add_prompts(engine, spread_prompts, greedy())
    run = run_all(engine)
    assert engine.scheduler.num_preemptions > 0
    assert engine.get_stats().num_preemptions == engine.scheduler.num_preemptions
    assert_matches_reference(run, ids, hf_greedy(name, spread_prompts, MAX_TOKENS))


@pytest.mark.parametrize("name", [LLAMA, "qwen3-moe"])
def test_chunked_prefill_keeps_transformers_greedy(
    name, tiny_model_path, hf_greedy, spread_prompts
):
    engine = make_engine(tiny_model_path(name), num_kv_blocks=80, max_num_batched_tokens=16)
    ids = add_prompts(engine, spread_prompts, greedy())
    run = run_all(engine)
    # All 8 prompts (665 tokens) pass through 16-token steps; the 200-token one alone
    # needs 13 of them.
    assert run.first_token_step[ids[-1]] >= sum(map(len, spread_prompts)) // 16
    assert_matches_reference(run, ids, hf_greedy(name, spread_prompts, MAX_TOKENS))


def test_prompt_longer_than_token_budget_alone(tiny_model_path, hf_greedy, spread_prompts):
    """Steps that only prefill sample nothing; the prompt's first token comes at step 13."""
    engine = make_engine(tiny_model_path(LLAMA), num_kv_blocks=20, max_num_batched_tokens=16)
    ids = add_prompts(engine, spread_prompts[-1:], greedy(8))
    run = run_all(engine)
    assert run.first_token_step[ids[0]] == 13
    assert_matches_reference(run, ids, hf_greedy(LLAMA, spread_prompts[-1:], 8))


def test_prefix_caching_skips_shared_prefix(tiny_model_path, hf_greedy, spread_prompts) -> None:
    shared = spread_prompts[-1][:100]
    prompts = [shared + suffix for suffix in (spread_prompts[1], spread_prompts[2], [7])]
    reference = hf_greedy(LLAMA, prompts, MAX_TOKENS)
    engine = make_engine(tiny_model_path(LLAMA), num_kv_blocks=40)
    engine.add_request("first", {"prompt_token_ids": prompts[0]}, greedy())
    first = run_all(engine)
    assert first.outputs["first"].num_cached_tokens == 0
    assert engine.get_stats().prefix_cache_hits == 0

    ids = add_prompts(engine, prompts, greedy())
    run = run_all(engine)
    # 6 full blocks of the 100 shared tokens; prompts[0] is all cached but its last token.
    cached = [run.outputs[rid].num_cached_tokens for rid in ids]
    assert cached == [96, 96, 96]
    assert engine.get_stats().prefix_cache_hits == 3 * 96
    assert_matches_reference(first, ["first"], reference[:1])
    assert_matches_reference(run, ids, reference)


def test_prefix_caching_off_computes_everything(tiny_model_path, spread_prompts) -> None:
    engine = make_engine(tiny_model_path(LLAMA), num_kv_blocks=40, enable_prefix_caching=False)
    for rid in ("a", "b"):
        engine.add_request(rid, {"prompt_token_ids": spread_prompts[-1]}, greedy(2))
        assert run_all(engine).outputs[rid].num_cached_tokens == 0
    assert engine.get_stats().prefix_cache_hits == 0


def test_blocks_free_after_aborts_mid_prefill_and_decode(tiny_model_path, spread_prompts) -> None:
    engine = make_engine(tiny_model_path(LLAMA), num_kv_blocks=24, max_num_batched_tokens=32)
    params = SamplingParams(n=2, temperature=1.0, seed=3, max_tokens=20, ignore_eos=True)
    ids = add_prompts(engine, spread_prompts[3:], params)  # 47, 88, 130, 171, 200 tokens
    run = Run()
    for _ in range(3):
        step_once(engine, run)
    seqs = {rid: engine.requests[rid].completions[0].seq for rid in ids}
    assert 0 < seqs["r1"].num_computed_tokens < seqs["r1"].num_prompt_tokens  # mid-prefill
    assert seqs["r4"].num_computed_tokens == 0  # still waiting
    engine.abort_request(["r1", "r4", "unknown"])
    while len(engine.requests["r0"].completions) < 2:
        step_once(engine, run)
    engine.abort_request("r0")  # decoding, both forks sharing the prompt's blocks
    run_all(engine, run)
    assert sorted(run.outputs) == ["r2", "r3"]
    assert engine.get_num_unfinished_requests() == 0


def test_generate_after_aborts_still_matches(tiny_model_path, hf_greedy, spread_prompts) -> None:
    engine = make_engine(tiny_model_path(LLAMA), num_kv_blocks=24, max_num_batched_tokens=32)
    add_prompts(engine, spread_prompts[4:], greedy())
    step_once(engine, Run())
    engine.abort_request(["r0", "r1", "r2", "r3"])
    assert_all_blocks_free(engine)
    ids = add_prompts(engine, spread_prompts[:3], greedy())
    assert_matches_reference(run_all(engine), ids, hf_greedy(LLAMA, spread_prompts[:3], 32))


@pytest.mark.parametrize(
    "params",
    [greedy(), SamplingParams(temperature=1.0, seed=123, max_tokens=MAX_TOKENS, ignore_eos=True)],
    ids=["greedy", "seeded"],
)
def test_same_tokens_alone_and_in_batch_of_16(params, tiny_model_path, spread_prompts) -> None:
    engine = make_engine(tiny_model_path(LLAMA), num_kv_blocks=100)
    target = spread_prompts[4]
    engine.add_request("alone", {"prompt_token_ids": target}, params)
    alone = run_all(engine).outputs["alone"].outputs[0].token_ids

    others = [spread_prompts[i % 8][i:] + [3 + i] for i in range(16)]
    noisy = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=40, ignore_eos=True)
    add_prompts(engine, others[:8], noisy)
    engine.add_request("batched", {"prompt_token_ids": target}, params)
    for i, prompt in enumerate(others[8:]):
        engine.add_request(f"late{i}", {"prompt_token_ids": prompt}, greedy(20))
    run = run_all(engine)
    assert run.outputs["batched"].outputs[0].token_ids == alone
    assert len(run.outputs) == 17


def test_seeded_sampling_differs_from_greedy(tiny_model_path, spread_prompts) -> None:
    """Guards the test above: the seeded request really samples."""
    engine = make_engine(tiny_model_path(LLAMA), num_kv_blocks=40)
    seeded = SamplingParams(temperature=1.0, seed=123, max_tokens=MAX_TOKENS, ignore_eos=True)
    engine.add_request("g", {"prompt_token_ids": spread_prompts[4]}, greedy())
    engine.add_request("s", {"prompt_token_ids": spread_prompts[4]}, seeded)
    outputs = run_all(engine).outputs
    assert outputs["g"].outputs[0].token_ids != outputs["s"].outputs[0].token_ids


def test_duplicate_request_id_raises_and_first_completes(tiny_model_path, spread_prompts):
    engine = make_engine(tiny_model_path(LLAMA), num_kv_blocks=40)
    engine.add_request("x", {"prompt_token_ids": spread_prompts[2]}, greedy(4))
    with pytest.raises(ValueError, match="request_id 'x' is already in use"):
        engine.add_request("x", {"prompt_token_ids": spread_prompts[3]}, greedy(4))
    outputs = run_all(engine).outputs
    assert outputs["x"].prompt_token_ids == spread_prompts[2]
    assert len(outputs["x"].outputs[0].token_ids) == 4


def test_stats_count_tokens(tiny_model_path, spread_prompts) -> None:
    engine = make_engine(tiny_model_path(LLAMA), num_kv_blocks=40)
    engine.add_request("a", {"prompt_token_ids": spread_prompts[2]}, greedy(5))
    engine.add_request("b", {"prompt_token_ids": spread_prompts[3]}, greedy(3))
    step_once(engine, Run())
    stats = engine.get_stats()
    assert (stats.num_running, stats.num_waiting) == (2, 0)
    assert 0 < stats.kv_cache_usage < 1
    run_all(engine)
    stats = engine.get_stats()
    assert stats.num_prompt_tokens == 23 + 47
    assert stats.num_generation_tokens == 5 + 3
    assert (stats.num_running, stats.num_free_blocks, stats.num_blocks) == (0, 40, 40)


def test_prompt_logprobs_match_transformers_under_chunking_and_preemption(
    tiny_model_path, hf_model, spread_prompts
) -> None:
    """Each prompt token's logprob and rank equal transformers' log_softmax of its logits,
    and streamed (delta) prompt logprobs add up to all of them, each sent once."""
    engine = make_engine(tiny_model_path(LLAMA), num_kv_blocks=17, max_num_batched_tokens=64)
    prompts = spread_prompts
    params = SamplingParams(max_tokens=32, ignore_eos=True, prompt_logprobs=1)
    ids = add_prompts(engine, prompts, params)
    delta = SamplingParams(max_tokens=4, prompt_logprobs=1, output_kind=RequestOutputKind.DELTA)
    engine.add_request("delta", {"prompt_token_ids": prompts[-1]}, delta)
    run = run_all(engine)
    assert engine.scheduler.num_preemptions > 0
    streamed = [lp for out in run.history["delta"] for lp in out.prompt_logprobs or []]
    assert len([o for o in run.history["delta"] if o.prompt_logprobs]) > 1
    results = [run.outputs[rid].prompt_logprobs for rid in ids] + [streamed]
    for logprobs, prompt in zip(results, prompts + prompts[-1:], strict=True):
        assert len(logprobs) == len(prompt) and logprobs[0] is None
        with torch.no_grad():
            ref = hf_model(LLAMA)(torch.tensor([prompt])).logits[0, :-1].log_softmax(-1)
        chosen = ref.gather(1, torch.tensor(prompt[1:])[:, None])[:, 0]
        ours = torch.tensor([lp[t].logprob for lp, t in zip(logprobs[1:], prompt[1:])])
        torch.testing.assert_close(ours, chosen, atol=1e-4, rtol=0)
        ranks = [lp[t].rank for lp, t in zip(logprobs[1:], prompt[1:])]
        assert ranks == ((ref > chosen[:, None]).sum(1) + 1).tolist()


def test_n_seeded_samples_survive_preemption(tiny_model_path, spread_prompts) -> None:
    """n=3 forks share their prompt's blocks (copy on write); preempting and recomputing
    them must not change a seeded request's samples."""
    params = SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=24, ignore_eos=True)
    results = []
    for kwargs in (dict(num_kv_blocks=120), dict(num_kv_blocks=17, max_num_batched_tokens=16)):
        engine = make_engine(tiny_model_path(LLAMA), **kwargs)
        ids = add_prompts(engine, spread_prompts[2:], params)
        run = run_all(engine)
        results.append([[c.token_ids for c in run.outputs[rid].outputs] for rid in ids])
        assert (engine.scheduler.num_preemptions > 0) == (kwargs["num_kv_blocks"] == 17)
    assert results[0] == results[1]
    assert all(len({tuple(c) for c in completions}) == 3 for completions in results[0])


def greedy_tokens(run: Run, ids: list[str]) -> list[list[int]]:
    return [run.outputs[rid].outputs[0].token_ids for rid in ids]


def test_request_that_cannot_sample_fails_alone(tiny_model_path, spread_prompts) -> None:
    """Its only allowed token is banned by min_tokens: it ends with an error at its first
    token; the others' tokens equal a run without it, and every block is freed."""
    path, prompts = tiny_model_path(LLAMA), spread_prompts[1:4]
    alone = make_engine(path, num_kv_blocks=60)
    alone_ids = add_prompts(alone, prompts, greedy(6))
    expected = greedy_tokens(run_all(alone), alone_ids)
    engine = make_engine(path, num_kv_blocks=60)
    ids = add_prompts(engine, prompts, greedy(6))
    doomed = SamplingParams(allowed_token_ids=[5], stop_token_ids=[5], min_tokens=2)
    engine.add_request("doomed", {"prompt_token_ids": prompts[0]}, doomed)
    run = run_all(engine)
    failed = run.outputs["doomed"]
    assert failed.finished and "no token can be sampled" in str(failed.error)
    assert failed.outputs[0].finish_reason == "error" and failed.outputs[0].token_ids == []
    assert greedy_tokens(run, ids) == expected
    assert all(run.outputs[rid].error is None for rid in ids)


def test_stop_check_that_raises_fails_only_its_request(
    tiny_model_path, spread_prompts, monkeypatch
) -> None:
    """A failure in one request's output processing (here its stop check) ends it alone."""
    from pagedllm.engine import output_processor

    real_check_stop = output_processor.check_stop

    def check_stop(seq, params, *args):  # noqa: ANN001, ANN202
        if (params.extra_args or {}).get("boom") and len(seq.output_token_ids) == 3:
            raise RuntimeError("stop check exploded")
        return real_check_stop(seq, params, *args)

    monkeypatch.setattr(output_processor, "check_stop", check_stop)
    engine = make_engine(tiny_model_path(LLAMA), num_kv_blocks=60)
    ids = add_prompts(engine, spread_prompts[1:3], greedy(8))
    boom = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, extra_args={"boom": 1})
    engine.add_request("boom", {"prompt_token_ids": spread_prompts[3]}, boom)
    run = run_all(engine)
    assert "stop check exploded" in str(run.outputs["boom"].error)
    assert len(run.outputs["boom"].outputs[0].token_ids) == 3
    assert [len(t) for t in greedy_tokens(run, ids)] == [8, 8]


def test_fan_out_beyond_the_cache_and_max_n_are_rejected(tiny_model_path, spread_prompts) -> None:
    """n x max_tokens must fit in the whole cache (40 blocks x 16 = 640 tokens); n <= max_n."""
    engine = make_engine(tiny_model_path(LLAMA), num_kv_blocks=40, max_n=8)
    prompt = {"prompt_token_ids": spread_prompts[1]}
    with pytest.raises(ValueError, match="more than the KV cache holds"):
        engine.add_request("wide", prompt, SamplingParams(n=3, max_tokens=None))
    with pytest.raises(ValueError, match="max_n=8"):
        engine.add_request("many", prompt, SamplingParams(n=9, max_tokens=1))
    engine.add_request("fits", prompt, SamplingParams(n=8, max_tokens=80))
    assert len(run_all(engine).outputs["fits"].outputs) == 8
