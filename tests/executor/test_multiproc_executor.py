"""MultiprocExecutor (pagedllm/executor/multiproc_executor.py): tensor parallelism over spawned
workers (gloo, 2 ranks on CPU) against tensor_parallel_size=1 on the same weights: identical
greedy tokens, fp32 logprobs within 1e-5, half the bytes per rank, clean shutdown, and a clear
error when a worker dies, in use or while starting."""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pagedllm import LLM, SamplingParams
from pagedllm.config import ModelConfig
from pagedllm.entrypoints.inspect import inspect_model
from tests.classifier_models import save_tiny_classifier
from tests.executor.parallel_jobs import assert_same, mixed_prompts
from tests.processes import MARKER_VARIABLE, alive, marked_processes

ENGINE = dict(skip_tokenizer_init=True, num_kv_blocks=256, block_size=4, dtype="float32")
PARAMS = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=3)


def param_bytes(llm: LLM) -> int:
    model = llm.llm_engine.executor.runner.model
    return sum(p.numel() * p.element_size() for p in model.parameters())


def worker_pids(llm: LLM) -> list[int]:
    return [p.pid for p in llm.llm_engine.executor.processes]


def generate_twice(llm: LLM) -> list:
    """Second round hits the prefix cache filled by the first; chunked prefill (budget 16)."""
    first = llm.generate(mixed_prompts(), PARAMS, use_tqdm=False)
    return first + llm.generate(mixed_prompts(), PARAMS, use_tqdm=False)


@pytest.mark.parametrize(
    "name",
    [
        "llama-gqa4",
        "llama-tied-mqa",
        "qwen3",
        "qwen3-moe",
        "granite",
        "olmo2",
        "gemma2",
        "gemma3",
        "smollm3",
        "ernie4_5",
        "seed-oss",
        "olmo3",
        "exaone4",
        "glm4",
        "starcoder2",
        "mixtral",
        "qwen2-moe",
        "olmoe",
        "granitemoe",
    ],
)
def test_tp2_matches_tp1(name: str, tiny_model_path) -> None:
    path = tiny_model_path(name)
    single = LLM(path, max_num_batched_tokens=16, **ENGINE)
    expected = generate_twice(single)
    single_bytes = param_bytes(single)
    with LLM(path, max_num_batched_tokens=16, tensor_parallel_size=2, **ENGINE) as tp:
        got = generate_twice(tp)
        assert tp.llm_engine.block_manager.prefix_cache_hits > 0
        tp_bytes = param_bytes(tp)
        report = inspect_model(ModelConfig.create(path, dtype="float32"), tp=2)
    assert_same(expected, got, 1e-5)
    assert tp_bytes == report["bytes_per_rank"]
    assert 0.45 * single_bytes < tp_bytes < 0.75 * single_bytes


def test_tp2_with_async_scheduling_matches_tp1(tiny_model_path) -> None:
    """Async scheduling over two ranks: rank 0 broadcasts each step's sampled ids, which
    both ranks write into the next step's placeholders; the same tokens and logprobs as
    one rank without it."""
    path = tiny_model_path("llama-gqa4")
    expected = generate_twice(LLM(path, max_num_batched_tokens=16, **ENGINE))
    kwargs = dict(max_num_batched_tokens=16, tensor_parallel_size=2, async_scheduling=True)
    with LLM(path, **kwargs, **ENGINE) as tp:
        runner = tp.llm_engine.executor.runner
        placeholders, launch = [], runner.launch

        def counting(step, rows):  # noqa: ANN001, ANN202
            placeholders.append(len(step.placeholder_rows))
            return launch(step, rows)

        runner.launch = counting
        got = generate_twice(tp)
    assert_same(expected, got, 1e-5)
    assert sum(placeholders) > len(mixed_prompts()) * PARAMS.max_tokens


def test_default_model_tp_same_greedy_text() -> None:
    """SmolLM2-135M has 9 query and 3 kv heads, so it splits over 3 ranks, not 2. Dequantized
    to float32, 3 ranks give the same 16 tokens as one."""
    params = SamplingParams(temperature=0, max_tokens=16)
    prompts = ["The capital of France is", "List three prime numbers:"]
    one = LLM(num_kv_blocks=600, quantization="none", dtype="float32")
    expected = [o.outputs[0].text for o in one.generate(prompts, params)]
    with LLM(num_kv_blocks=600, tensor_parallel_size=3, quantization="none", dtype="float32") as tp:
        assert [o.outputs[0].text for o in tp.generate(prompts, params)] == expected
    with pytest.raises(ValueError, match="9 attention heads are not divisible by tensor_parallel"):
        LLM(num_kv_blocks=600, tensor_parallel_size=2)


def test_default_model_tp_quantized_follows_one_rank() -> None:
    """Run as stored (Q4_1), 3 ranks split every layer on block boundaries, so each rank's
    integer block products are the one-rank run's; only the order of the float sums across
    ranks differs. That 1e-7 difference moves some activation across an 8-bit rounding
    boundary downstream, so the two runs differ by the activation-quantization noise
    (up to ~0.15 in a logprob here), not bit for bit: the first tokens, whose top-2 gaps are >= 1,
    are the same, and every chosen token's logprob agrees to 0.3."""
    params = SamplingParams(temperature=0, max_tokens=5, logprobs=0)
    prompt = "The capital of France is"
    (one,) = LLM(num_kv_blocks=600).generate(prompt, params)
    with LLM(num_kv_blocks=600, tensor_parallel_size=3) as tp:
        (three,) = tp.generate(prompt, params)
    a, b = one.outputs[0], three.outputs[0]
    assert a.token_ids == b.token_ids
    for lp_a, lp_b, token in zip(a.logprobs, b.logprobs, a.token_ids, strict=True):
        assert abs(lp_a[token].logprob - lp_b[token].logprob) <= 0.3


def test_close_leaves_no_process(tiny_model_path) -> None:
    llm = LLM(tiny_model_path("llama-gqa4"), tensor_parallel_size=2, **ENGINE)
    pids = worker_pids(llm)
    assert pids and all(alive(pid) for pid in pids)
    llm.close()
    assert not any(alive(pid) for pid in pids)


def test_dropping_the_llm_stops_workers(tiny_model_path) -> None:
    llm = LLM(tiny_model_path("llama-gqa4"), tensor_parallel_size=2, **ENGINE)
    pids = worker_pids(llm)
    del llm
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(pid) for pid in pids)


def test_killed_worker_raises_clear_error_fast(tiny_model_path) -> None:
    llm = LLM(tiny_model_path("llama-gqa4"), tensor_parallel_size=2, **ENGINE)
    assert llm.llm_engine.executor.is_healthy()
    os.kill(worker_pids(llm)[0], signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="tensor-parallel worker 1"):
        llm.generate(mixed_prompts(), PARAMS, use_tqdm=False)
    assert time.monotonic() - start < 10
    assert not llm.llm_engine.executor.is_healthy()
    llm.close()


def test_kv_heads_that_do_not_divide_tp_are_rejected(tiny_model_path) -> None:
    """4 query heads cannot be split over 3 ranks: a clear error before any worker starts."""
    with pytest.raises(ValueError, match="4 attention heads are not divisible by tensor_par"):
        LLM(tiny_model_path("qwen3"), tensor_parallel_size=3, **ENGINE)


def run_marked(args: list[str], marker: str) -> subprocess.CompletedProcess:
    """Run a script whose processes (spawned workers included) carry `marker` in their
    environment, so `marked_processes` can find any left behind."""
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2]), MARKER_VARIABLE: marker},
    )


def test_script_without_main_guard_fails_fast_with_advice(tiny_model_path, tmp_path) -> None:
    """multiprocessing's spawn re-imports the main module in each worker (vLLM gives the
    same advice): a module-level LLM must not hang rank 0 in its rendezvous."""
    script = tmp_path / "no_main_guard.py"
    script.write_text(
        "import sys\n"
        "from pagedllm import LLM\n"
        "LLM(sys.argv[1], tensor_parallel_size=2, skip_tokenizer_init=True, num_kv_blocks=256)\n"
    )
    path, marker = tiny_model_path("llama-gqa4"), f"no-guard-{os.getpid()}-{time.monotonic_ns()}"
    start = time.monotonic()
    result = run_marked([str(script), path], marker)
    assert time.monotonic() - start < 30
    assert result.returncode != 0
    assert 'if __name__ == "__main__":' in result.stderr, result.stderr[-3000:]
    assert "tensor-parallel worker 1 died" in result.stderr
    assert marked_processes(marker) == []


def test_worker_failing_to_load_its_shard_raises_its_error(tiny_model_path) -> None:
    """Worker 1's ModelRunner raises an injected MemoryError: LLM() raises it at once
    instead of waiting for a READY that never comes."""
    script = Path(__file__).with_name("tp_worker_fails_loading.py")
    marker = f"load-fails-{os.getpid()}-{time.monotonic_ns()}"
    result = run_marked([str(script), tiny_model_path("llama-gqa4")], marker)
    assert result.returncode == 0, result.stderr[-3000:]
    report = result.stdout
    assert "ERROR tensor-parallel worker 1 failed to start" in report
    assert "MemoryError: injected: the shard does not fit on this worker" in report
    seconds = float(report.split("SECONDS ")[1].split()[0])
    assert seconds < 30
    assert "LIVE_WORKERS 0" in report
    assert marked_processes(marker) == []


def test_tp2_pooling_equals_tp1(tiny_model_path) -> None:
    """A pooling model's steps (ModelRunner.pool on every rank) over 2 ranks: the same
    embeddings as one rank, within 1e-5, chunked prefill included."""
    path = tiny_model_path("qwen3")
    prompts = mixed_prompts()
    engine = dict(ENGINE, runner="pooling", pooler_config={"pooling_type": "MEAN"})
    with LLM(path, max_num_batched_tokens=16, **engine) as single:
        expected = single.embed(prompts, use_tqdm=False)
    with LLM(path, max_num_batched_tokens=16, tensor_parallel_size=2, **engine) as tp:
        got = tp.embed(prompts, use_tqdm=False)
    for want, have in zip(expected, got, strict=True):
        assert have.outputs.embedding == pytest.approx(want.outputs.embedding, abs=1e-5)


def test_tp2_classify_equals_tp1(tmp_path) -> None:
    """A classifier's pooled states over 2 ranks, through the engine's score head: the same
    label scores as one rank, within 1e-5, chunked prefill included."""
    path = save_tiny_classifier("qwen3", str(tmp_path), 3)
    prompts = mixed_prompts()
    with LLM(path, max_num_batched_tokens=16, **ENGINE) as single:
        expected = single.classify(prompts, use_tqdm=False)
    with LLM(path, max_num_batched_tokens=16, tensor_parallel_size=2, **ENGINE) as tp:
        got = tp.classify(prompts, use_tqdm=False)
    for want, have in zip(expected, got, strict=True):
        assert have.outputs.probs == pytest.approx(want.outputs.probs, abs=1e-5)


def test_an_llm_built_in_a_thread_that_ended_keeps_its_workers(tiny_model_path) -> None:
    """Workers follow their parent process, not the thread that started them."""
    built: list[LLM] = []
    thread = threading.Thread(
        target=lambda: built.append(
            LLM(tiny_model_path("llama-gqa4"), tensor_parallel_size=2, **ENGINE)
        )
    )
    thread.start()
    thread.join()
    (llm,) = built
    time.sleep(1)
    assert all(alive(pid) for pid in worker_pids(llm))
    assert llm.generate(mixed_prompts(), PARAMS, use_tqdm=False)
    llm.close()


def test_workers_exit_when_their_parent_is_killed(tiny_model_path, tmp_path) -> None:
    """SIGKILL leaves rank 0 no time to stop them: each worker watches its parent."""
    script = tmp_path / "killed_parent.py"
    script.write_text(
        "import sys, time\n"
        "from pagedllm import LLM\n"
        "if __name__ == '__main__':\n"
        "    llm = LLM(sys.argv[1], tensor_parallel_size=2, skip_tokenizer_init=True,\n"
        "              num_kv_blocks=256)\n"
        "    print('ready', flush=True)\n"
        "    time.sleep(600)\n"
    )
    marker = f"killed-parent-{os.getpid()}-{time.monotonic_ns()}"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2]), MARKER_VARIABLE: marker}
    process = subprocess.Popen(
        [sys.executable, str(script), tiny_model_path("llama-gqa4")],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert process.stdout.readline().strip() == "ready"
    process.kill()
    process.wait()
    assert marked_processes(marker) == []
