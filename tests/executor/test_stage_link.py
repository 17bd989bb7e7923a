"""Pipeline parallelism end to end (pagedllm/executor/stage_link.py and the executors around
it): PP=2 and PP=2 x TP=2 over spawned gloo ranks against one rank on the same weights
(reference: pipeline_parallel_size=1, float32): identical greedy tokens and logprobs, with
prefix caching, preemption, an abort while a micro-batch is in flight and a pooling
model; while a PP=2 job decodes, both stages work at once; a dead stage is a clear error."""

import os
import signal
import time

import pytest
import transformers

from pagedllm import LLM, SamplingParams
from pagedllm.core.scheduler import Scheduler
from pagedllm.core.sequence import Sequence
from pagedllm.executor import multiproc_executor
from pagedllm.executor.model_runner import ModelRunner
from pagedllm.executor.row_deltas import CachedRow, NewRow, RowDeltaSender
from tests.executor import busy_intervals
from tests.executor.parallel_jobs import assert_same, mixed_prompts
from tests.models.tiny_models import COMMON, save_tiny_model

ENGINE = dict(skip_tokenizer_init=True, block_size=4, dtype="float32", max_num_batched_tokens=16)
PARAMS = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logprobs=3)


def generate_twice(llm: LLM) -> list:
    """The second round hits the prefix cache the first filled."""
    first = llm.generate(mixed_prompts(), PARAMS, use_tqdm=False)
    return first + llm.generate(mixed_prompts(), PARAMS, use_tqdm=False)


@pytest.mark.parametrize(
    "name, tp",
    [("llama-gqa4", 1), ("llama-tied-mqa", 1), ("qwen3", 1), ("qwen3-moe", 1), ("qwen3-moe", 2)],
)
def test_pp2_matches_one_rank(name: str, tp: int, tiny_model_path) -> None:
    """PP alone computes every layer as one rank does: bit for bit. TP sums its row-parallel
    layers' parts in another order: within 1e-5, as tensor parallelism alone."""
    path = tiny_model_path(name)
    expected = generate_twice(LLM(path, num_kv_blocks=256, **ENGINE))
    with LLM(
        path, num_kv_blocks=256, pipeline_parallel_size=2, tensor_parallel_size=tp, **ENGINE
    ) as llm:
        got = generate_twice(llm)
        assert llm.llm_engine.block_manager.prefix_cache_hits > 0
        assert llm.llm_engine.executor.max_concurrent_batches == 2
    assert_same(expected, got, 0.0 if tp == 1 else 1e-5)


def test_pp2_preempts_aborts_in_flight_and_samples_seeded(tiny_model_path) -> None:
    """A cache too small for the job preempts sequences (never one in flight); seeded
    random sampling on the last stage follows each request's generator as one rank does; a
    request aborted while its micro-batch is in flight ends, and the others are unchanged."""
    path = tiny_model_path("llama-gqa4")
    one = LLM(path, num_kv_blocks=256, **ENGINE)
    expected = one.generate(mixed_prompts(), PARAMS, use_tqdm=False)
    seeded = [SamplingParams(temperature=1.0, seed=i, max_tokens=8, logprobs=1) for i in range(6)]
    expected_seeded = one.generate(mixed_prompts(), seeded, use_tqdm=False)
    with LLM(path, num_kv_blocks=24, max_model_len=80, pipeline_parallel_size=2, **ENGINE) as llm:
        assert_same(expected, llm.generate(mixed_prompts(), PARAMS, use_tqdm=False), 1e-5)
        assert_same(expected_seeded, llm.generate(mixed_prompts(), seeded, use_tqdm=False), 1e-5)
        engine = llm.llm_engine
        assert engine.scheduler.num_preemptions > 0
        for i, prompt in enumerate(mixed_prompts()):
            engine.add_request(str(i), prompt, PARAMS)
        engine.step()  # one micro-batch in flight
        (batch,) = engine.batch_queue
        victim = batch.out.scheduled[0].seq.request_id
        engine.abort_request(victim)
        finished = {}
        while engine.has_unfinished_requests():
            finished |= {o.request_id: o for o in engine.step() if o.finished}
        assert victim not in finished and not engine.scheduler.in_flight
        kept = [i for i in range(len(expected)) if str(i) != victim]
        assert_same([expected[i] for i in kept], [finished[str(i)] for i in kept], 1e-5)


def penalized_params() -> list[SamplingParams]:
    """Every penalty on every request: greedy, and seeded random with n=2."""
    penalties = dict(repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.4)
    common = dict(max_tokens=12, ignore_eos=True, logprobs=2, **penalties)
    greedy = SamplingParams(temperature=0, **common)
    return [greedy if i % 2 else SamplingParams(seed=i, n=2, **common) for i in range(6)]


@pytest.mark.parametrize("num_kv_blocks", [256, 24])
def test_pp2_penalties_and_seeds_match_one_rank(num_kv_blocks, tiny_model_path, monkeypatch):
    """The sampling rank keeps each row's tokens and generator: it gets a row in full once,
    then each step only its new token, and samples as one rank does, bit for bit. With a
    cache too small for the job, sequences are preempted after sampling tokens and resume
    with their state (their recomputed prefill is within 1e-5 of one rank's decodes, as
    in the test above)."""
    path = tiny_model_path("llama-gqa4")
    params = penalized_params()
    expected = LLM(path, num_kv_blocks=256, **ENGINE).generate(mixed_prompts(), params)
    deltas, preempted = [], []
    send, preempt = RowDeltaSender.deltas, Scheduler._preempt

    def record_deltas(sender: RowDeltaSender, *args: object) -> list:
        sent = send(sender, *args)
        deltas.extend(sent)
        return sent

    def record_preemption(scheduler: Scheduler, seq: Sequence) -> None:
        preempted.append(seq.num_output_tokens)
        preempt(scheduler, seq)

    monkeypatch.setattr(RowDeltaSender, "deltas", record_deltas)
    monkeypatch.setattr(Scheduler, "_preempt", record_preemption)
    engine = dict(num_kv_blocks=num_kv_blocks, max_model_len=80, pipeline_parallel_size=2)
    with LLM(path, **engine, **ENGINE) as llm:
        got = llm.generate(mixed_prompts(), params, use_tqdm=False)
    assert_same(expected, got, 0.0 if num_kv_blocks == 256 else 1e-5)
    new_keys = [d.row.key for d in deltas if isinstance(d, NewRow)]
    assert len(new_keys) == len(set(new_keys)) == sum(p.n for p in params)
    assert all(len(d.new_token_ids) == 1 for d in deltas if isinstance(d, CachedRow))
    assert (max(preempted, default=0) > 0) == (num_kv_blocks == 24)


def test_default_gguf_model_pp2_matches_one_rank() -> None:
    """SmolLM2-135M's 30 layers, 15 a stage, its Q4_1 blocks as stored."""
    params = SamplingParams(temperature=0, max_tokens=4, logprobs=2)
    prompts = ["The capital of France is", "List three prime numbers:"]
    engine = dict(num_kv_blocks=64, max_model_len=512, dtype="float32", device="cpu")
    expected = LLM(**engine).generate(prompts, params, use_tqdm=False)
    with LLM(pipeline_parallel_size=2, **engine) as llm:
        assert_same(expected, llm.generate(prompts, params, use_tqdm=False))


@pytest.fixture
def wide_model_path(tmp_path) -> str:
    """Layers wide enough that a decode step's compute outlasts the engine's own work."""
    config = transformers.LlamaConfig(
        **{**COMMON, "hidden_size": 384, "intermediate_size": 1024, "num_hidden_layers": 4},
        num_key_value_heads=4,
        tie_word_embeddings=False,
    )
    save_tiny_model(config, str(tmp_path / "wide"))
    return str(tmp_path / "wide")


def test_both_stages_are_busy_at_once_while_decoding(wide_model_path, tmp_path, monkeypatch):
    """Reference: the stages' busy intervals (time.monotonic around each model-runner call,
    on each rank) overlap, so two micro-batches are in flight at once."""
    monkeypatch.setenv(busy_intervals.BUSY_DIR, str(tmp_path))
    monkeypatch.setattr(multiproc_executor, "worker_main", busy_intervals.timed_worker_main)
    monkeypatch.setattr(ModelRunner, "forward_stage", ModelRunner.forward_stage)
    monkeypatch.setattr(ModelRunner, "execute", ModelRunner.execute)
    busy_intervals.record_busy(0)
    prompts = [{"prompt_token_ids": [5 + i, 6, 7]} for i in range(48)]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    engine = {**ENGINE, "max_num_batched_tokens": 512}
    with LLM(wide_model_path, num_kv_blocks=256, pipeline_parallel_size=2, **engine) as llm:
        llm.generate(prompts, params, use_tqdm=False)
    first, last = (busy_intervals.read_busy(str(tmp_path), rank) for rank in range(2))
    overlapping = [(a, b) for a in last for b in first if min(a[1], b[1]) - max(a[0], b[0]) > 0]
    assert len(first) >= 6 and len(last) >= 6
    assert len(overlapping) >= 3, (first, last)


def test_a_killed_last_stage_raises_clear_error_fast(tiny_model_path) -> None:
    """Rank 0 waits on the last stage's output: a dead last stage is an error, not a hang."""
    llm = LLM(tiny_model_path("llama-gqa4"), num_kv_blocks=256, pipeline_parallel_size=2, **ENGINE)
    os.kill(llm.llm_engine.executor.processes[0].pid, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="tensor-parallel worker 1"):
        llm.generate(mixed_prompts(), PARAMS, use_tqdm=False)
    assert time.monotonic() - start < 10
    llm.close()


def test_pp2_pooling_matches_one_rank(tiny_model_path) -> None:
    """A pooling model's chunks are pooled on the last stage and returned to rank 0."""
    engine = {**ENGINE, "max_num_batched_tokens": 8, "runner": "pooling", "num_kv_blocks": 256}
    prompts = [{"prompt_token_ids": list(range(5, 5 + n))} for n in (3, 11, 6)]
    path = tiny_model_path("llama-tied-mqa")
    expected = LLM(path, **engine).embed(prompts, use_tqdm=False)
    with LLM(path, pipeline_parallel_size=2, **engine) as llm:
        got = llm.embed(prompts, use_tqdm=False)
    assert [e.outputs.embedding for e in expected] == [g.outputs.embedding for g in got]
