"""LLMEngine (pagedllm/engine/llm_engine.py) driven step by step on tiny random checkpoints.
Reference: transformers' `generate(do_sample=False)` prompt by prompt, which preemption,
chunked prefill and prefix caching must not change; the block manager's invariants after
every step, and every block free once requests finish or are aborted; structured outputs
after a reasoning part against a scripted model's known greedy chain, and requests waiting
for their grammar to compile while others run."""

import gc
import json
import pathlib
from collections.abc import Iterator
from concurrent.futures import Future

import pytest

from pagedllm import LLM, LLMEngine
from pagedllm.executor.executor import StepFuture
from pagedllm.sampling_params import ReasoningTokens, SamplingParams, StructuredOutputsParams
from pagedllm.structured_output import check_grammar
from tests.engine.engine_helpers import (
    LLAMA,
    MAX_TOKENS,
    Run,
    add_prompts,
    assert_all_blocks_free,
    assert_matches_reference,
    greedy,
    make_engine,
    run_all,
    step_once,
)
from tests.entrypoints.openai.scripted_model import ANSWER_JSON, WEATHER, save_scripted_model


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


def test_cache_salt_shares_cached_blocks_with_the_same_salt_only(
    tiny_model_path, hf_greedy, spread_prompts
) -> None:
    """vLLM's cache_salt: the same prompt, one request at a time, hits the cache only after
    a request of the same salt (or of none after none); the prefix-cache counters and
    num_cached_tokens say so, and the greedy tokens are transformers' every time."""
    prompt = spread_prompts[-1][:100]  # 6 full blocks
    reference = hf_greedy(LLAMA, [prompt], 8)
    engine = make_engine(tiny_model_path(LLAMA), num_kv_blocks=60)
    salts = [None, "a", "b", "a", None, "b"]
    cached = []
    for i, salt in enumerate(salts):
        salted = {} if salt is None else {"cache_salt": salt}
        engine.add_request(str(i), {"prompt_token_ids": prompt, **salted}, greedy(8))
        run = run_all(engine)
        cached.append(run.outputs[str(i)].num_cached_tokens)
        assert_matches_reference(run, [str(i)], reference)
    assert cached == [0, 0, 0, 96, 96, 96]
    assert engine.get_stats().prefix_cache_hits == 3 * 96


def test_forks_and_recomputes_keep_the_cache_salt(tiny_model_path, spread_prompts) -> None:
    """n=2 forks carry their request's salt, which preemption (recompute) keeps: a salted
    request's greedy completions are the same after preemption as alone."""
    params = SamplingParams(n=2, temperature=0, max_tokens=24, ignore_eos=True)
    results = []
    for kwargs in (dict(num_kv_blocks=120), dict(num_kv_blocks=17, max_num_batched_tokens=16)):
        engine = make_engine(tiny_model_path(LLAMA), **kwargs)
        for i, prompt in enumerate(spread_prompts[2:]):
            engine.add_request(str(i), {"prompt_token_ids": prompt, "cache_salt": "s"}, params)
        while not any(len(r.completions) == 2 for r in engine.requests.values()):
            engine.step()
        seqs = [c.seq for r in engine.requests.values() for c in r.completions]
        assert {seq.cache_salt for seq in seqs} == {"s"}
        run = run_all(engine)
        results.append([[c.token_ids for c in run.outputs[str(i)].outputs] for i in range(6)])
        assert (engine.scheduler.num_preemptions > 0) == (kwargs["num_kv_blocks"] == 17)
    assert results[0] == results[1]


def test_a_nonzero_priority_needs_the_priority_policy(tiny_model_path) -> None:
    """vLLM's rule, at LLMEngine.add_request: fcfs takes priority 0 only."""
    engine = make_engine(tiny_model_path(LLAMA), num_kv_blocks=20)
    with pytest.raises(ValueError, match="Got priority -1 but priority scheduling is not enabled"):
        engine.add_request("r", {"prompt_token_ids": [5, 6]}, greedy(2), priority=-1)
    assert not engine.has_unfinished_requests()
    engine = make_engine(tiny_model_path(LLAMA), num_kv_blocks=20, scheduling_policy="priority")
    engine.add_request("r", {"prompt_token_ids": [5, 6]}, greedy(2), priority=-1)
    assert engine.requests["r"].completions[0].seq.priority == -1
    assert len(run_all(engine).outputs["r"].outputs[0].token_ids) == 2


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


@pytest.fixture(scope="module")
def scripted_llm(tmp_path_factory: pytest.TempPathFactory) -> LLM:
    folder = tmp_path_factory.mktemp("scripted")
    save_scripted_model(str(folder))
    return LLM(model=str(folder), num_kv_blocks=64, max_model_len=256)


@pytest.mark.parametrize("in_reasoning", [True, False])
def test_structured_outputs_start_after_the_reasoning_end_token(
    scripted_llm: LLM, in_reasoning: bool
) -> None:
    """Reference: the scripted model's greedy chain `<think> hmm </think> <tool_call> ...`
    (tests/entrypoints/openai/scripted_model.py). With reasoning_tokens the chain runs free
    up to `</think>` (the schema would refuse `<think>`: no mask), then the schema forces its
    only answer; each of n completions on its own. Without, the schema applies at once.
    `in_reasoning` False: `<think>` as the first token opens the reasoning part (qwen3)."""
    tokenizer = scripted_llm.get_tokenizer()
    think, end = tokenizer.convert_tokens_to_ids(["<think>", "</think>"])
    start = None if in_reasoning else think
    reasoning = ReasoningTokens([end], in_reasoning=in_reasoning, start_token_id=start)
    constraint = StructuredOutputsParams(json=WEATHER)
    outputs = {}
    for name, tokens in (("after", reasoning), ("at once", None)):
        fields = dict(structured_outputs=constraint, reasoning_tokens=tokens)
        params = SamplingParams(temperature=0, max_tokens=10, n=2, **fields)
        (out,) = scripted_llm.generate("user Weather? assistant", params, use_tqdm=False)
        outputs[name] = [(c.token_ids, c.finish_reason) for c in out.outputs]
    thought = tokenizer.convert_tokens_to_ids(["<think>", "hmm", "</think>", ANSWER_JSON])
    assert outputs["after"] == [(thought, "stop")] * 2
    assert outputs["at once"] == [(thought[-1:], "stop")] * 2


@pytest.fixture
def held_compile(scripted_llm: LLM, monkeypatch: pytest.MonkeyPatch) -> Iterator[Future]:
    """The engine's grammar compiles are held: each submit returns this future, which the
    test completes (the constraint is still checked when the request is added)."""
    manager = scripted_llm.llm_engine.structured_output
    held: Future = Future()

    def submit(params: StructuredOutputsParams, *args: object) -> Future:
        check_grammar(params)
        return held

    monkeypatch.setattr(manager, "submit", submit)
    yield held
    scripted_llm.llm_engine.abort_request(list(scripted_llm.llm_engine.requests))


def _add_free_and_constrained(engine: LLMEngine) -> None:
    free = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    constraint = StructuredOutputsParams(json=WEATHER)
    engine.add_request("free", "user Weather? assistant", free)
    engine.add_request(
        "json",
        "user Weather? assistant",
        SamplingParams(temperature=0, max_tokens=4, structured_outputs=constraint),
    )


def test_a_compiling_grammar_holds_up_only_its_own_request(
    scripted_llm: LLM, held_compile: Future
) -> None:
    """While its grammar compiles, the constrained request waits outside the scheduler
    (counted as waiting) and the free one runs to its end; then it joins and is answered."""
    engine = scripted_llm.llm_engine
    _add_free_and_constrained(engine)
    finished = {}
    while "free" not in finished:
        finished |= {o.request_id: o for o in engine.step() if o.finished}
        assert engine.get_stats().num_waiting == 1
    held_compile.set_result(
        engine.structured_output.new_matchers(StructuredOutputsParams(json=WEATHER), 1)
    )
    while engine.has_unfinished_requests():
        finished |= {o.request_id: o for o in engine.step() if o.finished}
    (answer,) = finished["json"].outputs
    assert (answer.text, answer.finish_reason) == (ANSWER_JSON, "stop")
    assert len(finished["free"].outputs[0].token_ids) == 4


def test_a_grammar_that_fails_to_compile_ends_its_request_alone(
    scripted_llm: LLM, held_compile: Future
) -> None:
    engine = scripted_llm.llm_engine
    _add_free_and_constrained(engine)
    engine.step()
    held_compile.set_exception(ValueError("structured_outputs has an invalid JSON schema: x"))
    (failed,) = [o for o in engine.step() if o.request_id == "json"]
    assert failed.finished and isinstance(failed.error, ValueError)
    assert failed.outputs[0].finish_reason == "error"
    assert set(engine.requests) == {"free"}


def test_abort_while_compiling_forgets_the_request(scripted_llm: LLM, held_compile: Future) -> None:
    engine = scripted_llm.llm_engine
    _add_free_and_constrained(engine)
    engine.abort_request(["json", "free"])
    assert not engine.has_unfinished_requests() and len(engine.waiting_for_grammar) == 0
    assert held_compile.cancelled()
    assert engine.step() == []


@pytest.mark.parametrize("enabled", [True, False])
def test_the_cyclic_gc_waits_while_the_engine_is_built(
    enabled: bool, tiny_model_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """from_engine_args builds the engine with the cyclic collector paused (its full passes
    over start-up's objects were 0.2-0.3 s of the default model's start-up), then leaves it
    as it found it."""
    during = []
    real_init = LLMEngine.__init__

    def init(self, config) -> None:  # noqa: ANN001
        during.append(gc.isenabled())
        real_init(self, config)

    monkeypatch.setattr(LLMEngine, "__init__", init)
    (gc.enable if enabled else gc.disable)()
    try:
        make_engine(tiny_model_path(LLAMA))
        assert during == [False] and gc.isenabled() == enabled
    finally:
        gc.enable()


def test_two_micro_batches_in_flight_keep_transformers_greedy(
    tiny_model_path, hf_greedy, spread_prompts
) -> None:
    """The batch queue as pipeline parallelism drives it (max_concurrent_batches 2), with each
    step's results deferred until the engine asks for them: the engine keeps two disjoint
    batches in flight, preempts (17 blocks of 16 for ~950 tokens), and still gives
    transformers' greedy tokens."""
    engine = make_engine(tiny_model_path(LLAMA), num_kv_blocks=17)
    executor = engine.executor
    executor.max_concurrent_batches = engine.scheduler.num_micro_batches = 2
    depths = []

    def deferred(step, rows) -> StepFuture:  # noqa: ANN001
        depths.append(len(engine.batch_queue) + 1)
        return StepFuture(lambda: executor.execute(step, rows))

    executor.execute_async = deferred
    ids = add_prompts(engine, spread_prompts, greedy())
    run = run_all(engine)
    assert max(depths) == 2 and engine.scheduler.num_preemptions > 0
    assert not engine.batch_queue and not engine.scheduler.in_flight
    assert_matches_reference(run, ids, hf_greedy(LLAMA, spread_prompts, MAX_TOKENS))


@pytest.mark.parametrize(
    ("architectures", "message"),
    [([], "names no architectures"), (["GPT2LMHeadModel"], "'GPT2LMHeadModel' is not supported")],
)
def test_an_unrunnable_architecture_fails_before_the_tokenizer_loads(
    architectures, message, tiny_model_path, tmp_path
) -> None:
    """The folder has no tokenizer either: the error must name the architecture, not that."""
    config = json.loads((pathlib.Path(tiny_model_path(LLAMA)) / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config | {"architectures": architectures}))
    with pytest.raises(ValueError, match=message):
        LLM(str(tmp_path), dtype="float32")
