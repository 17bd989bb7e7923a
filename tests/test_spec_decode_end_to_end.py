"""N-gram speculative decoding end to end (engine/drafter.py, core/scheduler.py's drafts,
engine/step_plan.py's verification rows, spec_decode/). Reference: the same requests
with speculation off, whose greedy tokens (and logprobs, finish and stop reasons, and the
seeded tokens of requests that do not draft) speculation must give exactly; and counters
showing that drafts were accepted."""

import pytest

from pagedllm import LLM
from pagedllm.core.scheduler import SchedulerOutput
from pagedllm.engine.llm_engine import LLMEngine
from pagedllm.executor.batch import BatchInputs
from pagedllm.executor.cpu_graph import CpuGraphRunner
from pagedllm.outputs import CompletionOutput
from pagedllm.sampling_params import SamplingParams
from tests.engine.engine_helpers import LLAMA, Run, make_engine, run_all, step_once

SPEC = {
    "method": "ngram",
    "num_speculative_tokens": 4,
    "prompt_lookup_max": 4,
    "prompt_lookup_min": 1,
}
REPEATED = [5, 9, 13, 17, 21, 25, 29, 33, 37, 41] * 6


def greedy(max_tokens: int = 40, **kwargs: object) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, **kwargs)


def record_schedules(engine: LLMEngine) -> list[SchedulerOutput]:
    """Wraps the scheduler: every step's output, in a list."""
    outs, schedule = [], engine.scheduler.schedule

    def recording() -> SchedulerOutput:
        outs.append(schedule())
        return outs[-1]

    engine.scheduler.schedule = recording
    return outs


def generate(engine: LLMEngine, requests: list, add_at: dict[int, int] | None = None) -> Run:
    """Runs (prompt, params) requests; those in add_at are added before that step."""
    add_at = add_at or {}
    run = Run()
    for i, (prompt, params) in enumerate(requests):
        if i not in add_at:
            engine.add_request(f"r{i}", {"prompt_token_ids": prompt}, params)
    while engine.has_unfinished_requests() or any(s >= run.num_steps for s in add_at.values()):
        for i, at in add_at.items():
            if at == run.num_steps:
                engine.add_request(f"r{i}", {"prompt_token_ids": requests[i][0]}, requests[i][1])
        step_once(engine, run)
    return run


def completions(run: Run, n: int) -> list[CompletionOutput]:
    return [run.outputs[f"r{i}"].outputs[0] for i in range(n)]


def assert_same(spec: Run, plain: Run, n: int) -> None:
    for a, b in zip(completions(spec, n), completions(plain, n), strict=True):
        assert a.token_ids == b.token_ids
        assert (a.finish_reason, a.stop_reason) == (b.finish_reason, b.stop_reason)
        assert a.logprobs == b.logprobs


def accepted(engine: LLMEngine) -> int:
    return engine.get_stats().spec_decoding.num_accepted_tokens


def test_greedy_tokens_equal_speculation_off_in_a_mixed_batch(tiny_model_path) -> None:
    """Drafting rows (stop tokens inside runs of accepted drafts, min_tokens, and on a prompt
    ending in the loop the tiny model falls into, lengths that cut drafts short) next to
    rows that never draft (logprobs, a penalty, a seed), all as without speculation."""
    path = tiny_model_path(LLAMA)
    plain = generate(make_engine(path), [(REPEATED, greedy(60))]).outputs["r0"].outputs[0]
    loop = REPEATED + plain.token_ids  # ends in 20 times the same token
    requests = [
        (REPEATED, greedy()),
        (REPEATED, greedy(stop_token_ids=[plain.token_ids[9]])),
        # Stops met inside a run of accepted drafts (found by trying).
        (REPEATED + plain.token_ids[:20], greedy(stop_token_ids=[284])),
        (REPEATED + plain.token_ids[:30], greedy(stop_token_ids=[51])),
        (REPEATED[1:], greedy(min_tokens=12)),
        *((loop, greedy(n)) for n in (1, 2, 3, 5, 6, 7, 9, 12, 13)),
    ]
    num_drafting = len(requests)
    requests += [
        (REPEATED, greedy(logprobs=2)),
        (REPEATED, greedy(repetition_penalty=1.2)),
        (REPEATED, SamplingParams(temperature=0.8, seed=3, max_tokens=30, ignore_eos=True)),
    ]
    engine = make_engine(path, speculative_config=SPEC)
    schedules = record_schedules(engine)
    spec = generate(engine, requests)
    plain = generate(make_engine(path), requests)
    assert_same(spec, plain, len(requests))
    assert accepted(engine) >= 20
    assert [c.finish_reason for c in completions(spec, 4)[1:]] == ["stop"] * 3
    never_ids = {f"r{i}" for i in range(num_drafting, len(requests))}
    drafted = {s.seq.request_id for out in schedules for s in out.scheduled if s.draft_token_ids}
    assert drafted and not drafted & never_ids


def test_drafts_verify_next_to_a_chunked_prefill(tiny_model_path) -> None:
    """A long prompt arrives while a sequence drafts: 24-token steps hold both."""
    path = tiny_model_path(LLAMA)
    long_prompt = [(7 * i) % 311 + 3 for i in range(150)]
    requests = [(REPEATED, greedy(60)), (long_prompt, greedy(20))]
    args = dict(max_num_batched_tokens=24)
    engine = make_engine(path, speculative_config=SPEC, **args)
    schedules = record_schedules(engine)
    spec = generate(engine, requests, add_at={1: 12})
    plain = generate(make_engine(path, **args), requests, add_at={1: 12})
    assert_same(spec, plain, 2)
    mixed = [
        out
        for out in schedules
        if any(s.draft_token_ids for s in out.scheduled)
        and any(not s.produces_token for s in out.scheduled)
    ]
    assert mixed and accepted(engine) > 0


def test_preempted_drafting_sequences_recompute_to_the_same_tokens(tiny_model_path) -> None:
    """17 blocks of 16 for 6 sequences of ~100 tokens: sequences are preempted and
    recomputed, their drafts dropped and proposed again."""
    path = tiny_model_path(LLAMA)
    requests = [(REPEATED[i:], greedy(50)) for i in range(6)]
    engine = make_engine(path, speculative_config=SPEC, num_kv_blocks=17)
    assert_same(
        generate(engine, requests), generate(make_engine(path, num_kv_blocks=17), requests), 6
    )
    assert engine.scheduler.num_preemptions > 0 and accepted(engine) > 0


def test_prefix_hits_on_blocks_that_held_rejected_drafts_read_the_right_kv(
    tiny_model_path,
) -> None:
    """A prompt holding a finished sequence's tokens hits the prefix cache on the blocks
    where its drafts were computed, rejected and overwritten."""
    path = tiny_model_path(LLAMA)
    engine, plain_engine = make_engine(path, speculative_config=SPEC), make_engine(path)
    first = [(REPEATED, greedy(60))]
    spec = generate(engine, first)
    assert_same(spec, generate(plain_engine, first), 1)
    assert engine.get_stats().spec_decoding.num_draft_tokens > accepted(engine) > 0
    again = [(REPEATED + completions(spec, 1)[0].token_ids + [7], greedy(30))]
    assert_same(generate(engine, again), generate(plain_engine, again), 1)
    assert engine.block_manager.prefix_cache_hits >= 112  # 7 of the 120 tokens' blocks


def test_random_sampling_with_drafts_runs_every_completion_to_its_length(
    tiny_model_path,
) -> None:
    engine = make_engine(tiny_model_path(LLAMA), speculative_config=SPEC)
    params = SamplingParams(n=3, temperature=0.7, top_k=3, max_tokens=30, ignore_eos=True)
    run = run_all(engine, generate(engine, [(REPEATED, params)]))
    outputs = run.outputs["r0"].outputs
    assert [len(c.token_ids) for c in outputs] == [30, 30, 30]
    assert accepted(engine) > 0


def test_verification_steps_replay_the_captured_decode_graphs(
    tiny_model_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One sequence's step verifying d drafts runs as 1 + d decode rows
    (executor/batch.py's as_decode_rows), which the CPU graph runner replays."""
    steps = []
    run = CpuGraphRunner.run

    def spy(self: CpuGraphRunner, batch: BatchInputs, placeholders: object = None) -> object:
        hidden = run(self, batch, placeholders)
        steps.append((batch.attn_metadata.num_seqs, hidden is not None))
        return hidden

    monkeypatch.setattr(CpuGraphRunner, "run", spy)
    engine = make_engine(tiny_model_path(LLAMA), speculative_config=SPEC)
    generate(engine, [(REPEATED, greedy(40))])
    assert accepted(engine) > 0
    assert any(num_rows > 1 and replayed for num_rows, replayed in steps)


@pytest.fixture(scope="module")
def default_llms() -> tuple[LLM, LLM]:
    """The default model (it has a tokenizer, for stop strings), with and without drafts."""
    args = dict(num_kv_blocks=64, max_model_len=512)
    return LLM(speculative_config=SPEC, **args), LLM(**args)


QUOTE = [
    {
        "role": "user",
        "content": "Repeat exactly: The quick brown fox jumps over the lazy dog near the "
        "river bank, and the dog sleeps while the fox runs into the green forest.",
    }
]


def test_stop_strings_and_lengths_inside_accepted_runs_on_the_default_model(
    default_llms,
) -> None:
    spec_llm, plain_llm = default_llms
    text = plain_llm.chat(QUOTE, SamplingParams(temperature=0, max_tokens=40), use_tqdm=False)
    words = text[0].outputs[0].text.split()
    params = [SamplingParams(temperature=0, max_tokens=n) for n in range(1, 16)]
    params += [SamplingParams(temperature=0, max_tokens=40, stop=[w]) for w in words[3:12]]
    params += [
        SamplingParams(
            temperature=0, max_tokens=40, stop=[words[6]], include_stop_str_in_output=True
        )
    ]
    spec = spec_llm.chat([QUOTE] * len(params), params, use_tqdm=False)
    plain = plain_llm.chat([QUOTE] * len(params), params, use_tqdm=False)
    for a, b in zip(spec, plain, strict=True):
        got, want = a.outputs[0], b.outputs[0]
        assert (got.text, got.token_ids) == (want.text, want.token_ids)
        assert (got.finish_reason, got.stop_reason) == (want.finish_reason, want.stop_reason)
    assert accepted(spec_llm.llm_engine) >= 30


def test_tensor_parallel_ranks_verify_the_same_rows(tiny_model_path) -> None:
    """Two tensor-parallel ranks (the peer runs each verification step's forward from the
    step it is sent): the greedy tokens are one rank's without speculation."""
    path = tiny_model_path(LLAMA)
    requests = [(REPEATED, greedy(40)), (REPEATED[3:], greedy(30))]
    engine = make_engine(path, speculative_config=SPEC, tensor_parallel_size=2)
    try:
        spec = generate(engine, requests)
        assert accepted(engine) > 0
    finally:
        engine.shutdown()
    assert_same(spec, generate(make_engine(path), requests), 2)
