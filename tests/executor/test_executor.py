"""Executor and DistributedExecutor (pagedllm/executor/executor.py). Reference: their contracts:
the in-process executor hands each call to its ModelRunner and runs the logits processors'
request checks; rank 0 of a tensor-parallel world broadcasts each call (the step, never the
sampler rows: only rank 0 samples) before running it itself."""

import dataclasses
from collections.abc import Callable

import pytest
import torch

from pagedllm.config import EngineConfig
from pagedllm.engine import llm_engine
from pagedllm.engine.arg_utils import EngineArgs
from pagedllm.executor import executor
from pagedllm.executor.batch import SeqChunk
from pagedllm.executor.executor import DistributedExecutor, Executor
from pagedllm.executor.model_runner import StepInput
from pagedllm.executor.stage_link import StageLink
from pagedllm.executor.worker import EXECUTE, INIT_KV_CACHE, PROFILE_RUN, SHUTDOWN
from pagedllm.sample.logits_processors import BatchUpdate, LogitsProcessor
from pagedllm.sample.metadata import SamplingRow
from pagedllm.sampling_params import SamplingParams


class RejectFlag(LogitsProcessor):
    """Rejects requests whose extra_args carry "reject"; changes no logits."""

    @classmethod
    def validate_params(cls, params: SamplingParams) -> None:
        if (params.extra_args or {}).get("reject"):
            raise ValueError("RejectFlag: this request is rejected")

    def is_argmax_invariant(self) -> bool:
        return True

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        pass

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return logits


@pytest.fixture
def config(tiny_model_path: Callable[[str], str]) -> EngineConfig:
    args = EngineArgs(tiny_model_path("llama-gqa-llama3"), dtype="float32", device="cpu")
    args.logits_processors = (RejectFlag,)
    return args.create_engine_config()


def test_executor_runs_the_model_in_process(config) -> None:
    """2 kv heads x 16 x 2 layers x K and V x 4 bytes = 512 bytes per token."""
    ex = Executor(config)
    assert ex.kv_cache_bytes_per_token == 512
    ex.init_kv_cache(3)
    assert ex.runner.kv_cache.shape == (2, 2, 3, 16, 2, 16)
    step = StepInput([SeqChunk([5, 6, 7], 0, [0])], [], [0], [])
    out = ex.execute(step, [SamplingRow(SamplingParams(temperature=0), [5, 6, 7], [])])
    assert out.sampler_output.sampled_token_ids.shape == (1,)
    assert ex.is_healthy()
    ex.shutdown()


def test_validate_params_runs_the_logits_processors_checks(config) -> None:
    ex = Executor(config)
    ex.validate_params(SamplingParams())
    with pytest.raises(ValueError, match="RejectFlag: this request is rejected"):
        ex.validate_params(SamplingParams(extra_args={"reject": True}))


def test_distributed_executor_broadcasts_each_call_before_running_it(config, monkeypatch) -> None:
    events = []
    monkeypatch.setattr(StageLink, "send_message", lambda _, message: events.append(message))
    monkeypatch.setattr(executor, "shutdown_barrier", lambda: events.append("barrier"))
    monkeypatch.setattr(
        executor, "destroy_distributed_environment", lambda: events.append("destroy")
    )
    ex = DistributedExecutor(config)
    assert events == []
    ex.init_kv_cache(3)
    assert events == [(INIT_KV_CACHE, 3)] and ex.runner.kv_cache.shape[2] == 3

    run = ex.runner.launch
    monkeypatch.setattr(ex.runner, "launch", lambda *args: (events.append("run"), run(*args))[1])
    step = StepInput([SeqChunk([5, 6, 7], 0, [0])], [], [0], [])
    rows = [SamplingRow(SamplingParams(temperature=0), [5, 6, 7], [])]
    out = ex.execute(step, rows)
    assert events[1:] == [(EXECUTE, (step, None)), "run"]  # rank 0 samples: no rows sent
    assert out.sampler_output.sampled_token_ids.shape == (1,)

    ex.shutdown()
    assert events[3:] == [(SHUTDOWN, None), "barrier", "destroy"]
    ex.shutdown()  # once only
    assert len(events) == 6


def test_the_gpu_profile_is_asked_of_every_rank_and_the_least_kept(config, monkeypatch) -> None:
    """Rank 0 sends the profile call, profiles itself (sampling), and keeps the least of
    the ranks' budgets: here another rank reports 3 MiB, under rank 0's 5."""
    events = []
    monkeypatch.setattr(StageLink, "send_message", lambda _, message: events.append(message))
    monkeypatch.setattr(StageLink, "max_over_ranks", lambda _, value: max(value, -(3 << 20)))
    ex = DistributedExecutor(config)
    samples = []
    monkeypatch.setattr(
        ex.runner, "available_kv_cache_bytes", lambda sample=True: samples.append(sample) or 5 << 20
    )
    assert ex.available_kv_cache_bytes() == 3 << 20
    assert events == [(PROFILE_RUN, None)] and samples == [True]


def test_the_engine_sizes_a_profiled_gpu_cache_by_the_profile(config, monkeypatch) -> None:
    """Where the GPU is profiled (kv_cache.profiles_gpu_memory) the executor's figure is the
    budget: 512 bytes a token, 16-token blocks, 40 blocks' worth and a little more."""
    monkeypatch.setattr(llm_engine, "profiles_gpu_memory", lambda c: True)
    monkeypatch.setattr(Executor, "available_kv_cache_bytes", lambda self: 40 * 512 * 16 + 100)
    config = dataclasses.replace(config, skip_tokenizer_init=True)
    assert llm_engine.LLMEngine(config).num_blocks == 40
