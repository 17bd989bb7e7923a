"""Async scheduling (EngineArgs.async_scheduling; core/scheduler.py, engine/llm_engine.py):
the engine schedules and launches the next step before processing the last, and a
sequence's next token is read from the last step's sampled ids on the device. On the CPU
the executor runs the same schedule as on a GPU (its futures report done only once asked),
so the placeholders are exercised here. Reference: transformers' greedy tokens, and the
synchronous engine's tokens, logprobs and finish reasons for every sampling feature."""

import random

import pytest

from pagedllm import LLM
from pagedllm.sampling_params import ReasoningTokens, SamplingParams, StructuredOutputsParams
from tests.engine.engine_helpers import (
    LLAMA,
    MAX_TOKENS,
    add_prompts,
    assert_all_blocks_free,
    assert_matches_reference,
    greedy,
    make_engine,
    run_all,
    step_once,
)
from tests.engine.engine_helpers import Run as EngineRun
from tests.entrypoints.openai.scripted_model import ANSWER_JSON, WEATHER, save_scripted_model
from tests.models.tiny_models import tiny_configs


def _count_placeholders(engine) -> list[int]:  # noqa: ANN001
    """Wraps the runner's launch: the placeholder rows of every step, in a list."""
    counts, launch = [], engine.executor.runner.launch

    def counting(step, rows):  # noqa: ANN001, ANN202
        counts.append(len(step.placeholder_rows))
        return launch(step, rows)

    engine.executor.runner.launch = counting
    return counts


@pytest.mark.parametrize(
    "kwargs",
    [dict(num_kv_blocks=17), dict(max_num_batched_tokens=16), dict(enforce_eager=True)],
)
def test_async_scheduling_keeps_transformers_greedy(
    kwargs, tiny_model_path, hf_greedy, spread_prompts
) -> None:
    """Under preemption (17 blocks of 16 for ~950 tokens), chunked prefill (16-token steps)
    and with every step eager (else decode steps replay the CPU's captured launches): most
    decode steps read their tokens from the step before."""
    engine = make_engine(tiny_model_path(LLAMA), async_scheduling=True, **kwargs)
    counts = _count_placeholders(engine)
    ids = add_prompts(engine, spread_prompts, greedy())
    run = run_all(engine)
    assert sum(counts) > len(spread_prompts) * MAX_TOKENS // 2
    assert not engine.batch_queue and not engine.scheduler.in_flight  # the last step dropped
    if "num_kv_blocks" in kwargs:
        assert engine.scheduler.num_preemptions > 0
    assert_matches_reference(run, ids, hf_greedy(LLAMA, spread_prompts, MAX_TOKENS))


def _mixed_requests() -> list[tuple[list[int], SamplingParams]]:
    """Requests that run ahead and requests that may not (penalties, bad words, min_tokens
    counting the token in flight, n > 1 at its fork), with stops at different steps."""
    prompt = [5, 9, 13, 17, 21, 25, 29, 33, 37, 41, 45, 49, 53, 57, 61, 65, 69, 73]
    seeded = dict(temperature=0.9, top_p=0.9, seed=7, logprobs=3)
    params = [
        SamplingParams(temperature=0, max_tokens=20, logprobs=2),
        SamplingParams(temperature=0, max_tokens=3, ignore_eos=True),
        SamplingParams(max_tokens=17, ignore_eos=True, **seeded),
        SamplingParams(n=3, max_tokens=9, ignore_eos=True, **seeded),
        SamplingParams(temperature=0, max_tokens=12, repetition_penalty=1.3, presence_penalty=0.5),
        SamplingParams(temperature=0, max_tokens=10, min_tokens=6, stop_token_ids=[3, 4, 6]),
        SamplingParams(temperature=0, max_tokens=14, stop_token_ids=[7, 11], logprobs=1),
        SamplingParams(temperature=0.7, top_k=5, max_tokens=11, seed=3, prompt_logprobs=2),
    ]
    # Shared prefixes (the prefix cache) and prompts of different lengths.
    return [(prompt[: 6 + 2 * i] + [i], p) for i, p in enumerate(params)]


def _outputs(engine, requests) -> dict:  # noqa: ANN001
    for i, (prompt, params) in enumerate(requests):
        engine.add_request(f"r{i}", {"prompt_token_ids": prompt}, params)
    run = run_all(engine)
    return {
        rid: [(c.token_ids, c.logprobs, c.finish_reason, c.cumulative_logprob) for c in out.outputs]
        + [out.prompt_logprobs]
        for rid, out in run.outputs.items()
    }


@pytest.mark.parametrize("kwargs", [{}, dict(num_kv_blocks=16, max_num_batched_tokens=24)])
def test_async_scheduling_gives_the_synchronous_engines_outputs(kwargs, tiny_model_path) -> None:
    """Every request's tokens, logprobs, finish reasons and prompt logprobs are those of the
    synchronous engine, with seeded sampling, n > 1, stops, min_tokens and penalties; with
    room for all, and under preemption with chunked prefill."""
    path = tiny_model_path(LLAMA)
    sync = _outputs(make_engine(path, **kwargs), _mixed_requests())
    engine = make_engine(path, async_scheduling=True, **kwargs)
    counts = _count_placeholders(engine)
    assert _outputs(engine, _mixed_requests()) == sync
    assert sum(counts) > 0
    assert (engine.scheduler.num_preemptions > 0) == bool(kwargs)


def test_a_forking_request_runs_ahead_as_its_first_completion(tiny_model_path) -> None:
    """n = 3: while its first tokens are in flight, the sequence runs ahead as completion
    0 (the step after the prompt reads one placeholder); the forked completions join the
    step after. The synchronous engine's seeded tokens and logprobs."""
    params = SamplingParams(n=3, temperature=0.8, seed=5, max_tokens=6, ignore_eos=True, logprobs=1)
    requests = [([3, 1, 4, 1, 5], params)]
    path = tiny_model_path(LLAMA)
    sync = _outputs(make_engine(path), requests)
    engine = make_engine(path, async_scheduling=True)
    counts = _count_placeholders(engine)
    assert _outputs(engine, requests) == sync
    assert counts[:3] == [0, 1, 1]


def test_sampling_that_needs_the_last_token_on_the_host_waits_for_it_but_not_the_forward(
    tiny_model_path,
) -> None:
    """While min_tokens still counts a request's tokens, its next step's forward still runs
    ahead on a placeholder, and that step's sampling is launched once the step before is
    processed (executor.launch_sampling): the synchronous engine's tokens."""
    counting = SamplingParams(temperature=0, max_tokens=12, min_tokens=6, stop_token_ids=[3])
    requests = [([1, 2, 3], greedy(16)), ([4, 5, 6], counting)]
    path = tiny_model_path(LLAMA)
    sync = _outputs(make_engine(path), requests)
    engine = make_engine(path, async_scheduling=True)
    late, launch_sampling = [], engine.executor.launch_sampling

    def recording(step, forward, rows):  # noqa: ANN001, ANN202
        late.append([step.chunks[i].key[0] for i, _ in step.placeholder_rows])
        return launch_sampling(step, forward, rows)

    engine.executor.launch_sampling = recording
    assert _outputs(engine, requests) == sync
    assert 4 <= len(late) and sum("r1" in read for read in late) >= 4


def test_structured_outputs_run_ahead_with_their_grammar_applied_late(tmp_path) -> None:
    """The scripted model (tests/entrypoints/openai/scripted_model.py) with a schema after
    a reasoning part, n = 2, beside a free request: under async scheduling the same
    completions as without it (the forked and constrained steps sampled once the step
    before is processed)."""
    save_scripted_model(str(tmp_path))
    outputs = []
    for async_scheduling in (False, True):
        llm = LLM(
            str(tmp_path),
            num_kv_blocks=64,
            max_model_len=256,
            device="cpu",
            async_scheduling=async_scheduling,
        )
        tokenizer = llm.get_tokenizer()
        end = tokenizer.convert_tokens_to_ids("</think>")
        constrained = SamplingParams(
            temperature=0,
            max_tokens=10,
            n=2,
            structured_outputs=StructuredOutputsParams(json=WEATHER),
            reasoning_tokens=ReasoningTokens([end], in_reasoning=True),
        )
        free = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
        prompts = ["user Weather? assistant"] * 2
        results = llm.generate(prompts, [constrained, free], use_tqdm=False)
        outputs.append([[(c.token_ids, c.finish_reason) for c in r.outputs] for r in results])
    assert outputs[0] == outputs[1]
    assert outputs[1][0][0][0][-1] == tokenizer.convert_tokens_to_ids(ANSWER_JSON)


@pytest.mark.parametrize(
    "penalties",
    [dict(repetition_penalty=1.5), dict(frequency_penalty=0.8, presence_penalty=0.6)],
)
def test_penalized_requests_run_ahead_with_the_synchronous_engines_tokens(
    penalties, tiny_model_path, spread_prompts
) -> None:
    """Penalties count a row's token still in flight on the device: penalized requests run
    ahead, and their tokens and logprobs are the synchronous engine's."""
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=2, **penalties)
    requests = [(prompt, params) for prompt in spread_prompts]
    path = tiny_model_path(LLAMA)
    sync = _outputs(make_engine(path), requests)
    engine = make_engine(path, async_scheduling=True)
    counts = _count_placeholders(engine)
    assert _outputs(engine, requests) == sync
    assert sum(counts) > len(spread_prompts) * 24 // 2


def test_an_abort_while_two_steps_are_in_flight(tiny_model_path, hf_greedy, spread_prompts):
    """A request aborted between steps (its sequence in both batches in flight) ends there;
    the others keep transformers' greedy tokens and every block comes back."""
    engine = make_engine(tiny_model_path(LLAMA), async_scheduling=True)
    ids = add_prompts(engine, spread_prompts, greedy())
    run = EngineRun()
    for _ in range(4):
        step_once(engine, run)
    assert len(engine.batch_queue) == 1  # one step in flight between calls
    engine.abort_request(ids[0])
    run_all(engine, run)
    assert ids[0] not in run.outputs
    reference = hf_greedy(LLAMA, spread_prompts, MAX_TOKENS)
    assert_matches_reference(run, ids[1:], reference[1:])
    assert_all_blocks_free(engine)


def test_a_pooling_model_refuses_async_scheduling(tiny_model_path) -> None:
    kwargs = dict(runner="pooling", pooler_config={"pooling_type": "MEAN"}, device="cpu")
    with pytest.raises(ValueError, match="async_scheduling is for models that generate"):
        make_engine(tiny_model_path("qwen3"), async_scheduling=True, **kwargs)


def test_a_sequence_reaching_max_model_len_stops_as_without_async_scheduling(
    tiny_model_path,
) -> None:
    """max_model_len 64: the step run ahead of the token that fills the context computes
    position 63, the last there is, and its token is dropped; the same tokens as without
    async scheduling, ended by "length"."""
    requests = [(list(range(5, 65 - k)), greedy(40)) for k in (4, 7)]
    path = tiny_model_path(LLAMA)
    sync = _outputs(make_engine(path, max_model_len=64), requests)
    got = _outputs(make_engine(path, max_model_len=64, async_scheduling=True), requests)
    assert got == sync
    assert [out[0][2] for out in got.values()] == ["length", "length"]


def _random_params(rng: random.Random, vocab_size: int) -> SamplingParams:
    """Greedy or seeded sampling with any mix of n, logprobs, prompt logprobs, stop ids,
    min_tokens, penalties, logit bias and allowed tokens."""
    kwargs: dict = dict(max_tokens=rng.randint(1, 20), temperature=rng.choice([0, 0, 0.8]))
    if kwargs["temperature"]:
        kwargs.update(
            seed=rng.randrange(1000), top_p=rng.choice([1.0, 0.9]), top_k=rng.choice([0, 9])
        )
    optional = {
        "n": lambda: rng.randint(2, 3),
        "logprobs": lambda: rng.randint(0, 2),
        "prompt_logprobs": lambda: rng.randint(0, 1),
        "stop_token_ids": lambda: rng.sample(range(vocab_size), 8),
        "min_tokens": lambda: rng.randint(0, kwargs["max_tokens"]),
        "repetition_penalty": lambda: rng.choice([1.2, 0.8]),
        "presence_penalty": lambda: rng.choice([0.5, -0.5]),
        "logit_bias": lambda: {rng.randrange(vocab_size): 5.0},
        "allowed_token_ids": lambda: rng.sample(range(vocab_size), 20),
    }
    for name, value in optional.items():
        if rng.random() < 0.2:
            kwargs[name] = value()
    return SamplingParams(ignore_eos=rng.random() < 0.5, **kwargs)


def _run_arrivals(engine, requests, arrivals: list[int], aborts: dict[int, int]) -> dict:  # noqa: ANN001
    """Adds request i before step arrivals[i], aborts it before step aborts[i]; -> the
    finished requests' completions, prompt logprobs and errors."""
    outputs, step = {}, 0
    while step <= max(arrivals) or engine.has_unfinished_requests():
        for i, (prompt, params) in enumerate(requests):
            if arrivals[i] == step:
                engine.add_request(f"r{i}", {"prompt_token_ids": prompt}, params)
            if aborts.get(i) == step:
                engine.abort_request(f"r{i}")
        for out in engine.step():
            if out.finished:
                completions = [
                    (c.token_ids, c.logprobs, c.finish_reason, c.stop_reason) for c in out.outputs
                ]
                outputs[out.request_id] = (completions, out.prompt_logprobs, out.error)
        engine.block_manager.check_invariants(engine.scheduler.running)
        step += 1
    assert_all_blocks_free(engine)
    return outputs


@pytest.mark.parametrize("seed", range(8))
def test_random_request_mixes_give_the_synchronous_engines_outputs(seed, tiny_model_path) -> None:
    """Random requests (random sampling features, shared prefixes) arriving and aborted at
    random steps, under a random cache size, token budget, sequence limit, block size and
    prefix caching: every request not aborted finishes with the synchronous engine's
    completions, and every block comes back."""
    rng = random.Random(seed)
    name = rng.choice([LLAMA, "qwen3"])
    vocab_size = tiny_configs()[name].vocab_size
    config = {
        "num_kv_blocks": rng.choice([16, 24, 64]),
        "max_num_batched_tokens": rng.choice([16, 40, 256]),
        "max_num_seqs": rng.choice([3, 256]),
        "block_size": rng.choice([16, 16, 32]),
        "enable_prefix_caching": rng.random() < 0.7,
    }
    prefix = [rng.randrange(vocab_size) for _ in range(40)]
    requests = [
        (
            prefix[: rng.randint(0, 40)]
            + [rng.randrange(vocab_size) for _ in range(rng.randint(1, 50))],
            _random_params(rng, vocab_size),
        )
        for _ in range(rng.randint(6, 16))
    ]
    arrivals = [rng.choice([0, rng.randint(0, 20)]) for _ in requests]
    aborts = {i: at + rng.randint(0, 8) for i, at in enumerate(arrivals) if rng.random() < 0.2}
    path = tiny_model_path(name)
    sync = _run_arrivals(make_engine(path, **config), requests, arrivals, aborts)
    engine = make_engine(path, async_scheduling=True, **config)
    got = _run_arrivals(engine, requests, arrivals, aborts)
    for results in (sync, got):
        for i in aborts:
            results.pop(f"r{i}", None)  # it may have finished before its abort
    assert got == sync
    assert len(got) == len(requests) - len(aborts)
