"""Tensor-parallel worker helpers (pagedllm/executor/worker.py). Reference: their contracts:
NCCL for CUDA devices and gloo otherwise; a CUDA rank on GPU local_rank, CPU ranks sharing the
cores; the control loop doing what rank 0 sends until it says shutdown."""

import os

import pytest
import torch

from pagedllm.executor import worker
from pagedllm.executor.model_runner import ModelRunner, StepInput
from pagedllm.executor.stage_link import StageLink
from pagedllm.executor.worker import (
    EXECUTE,
    INIT_KV_CACHE,
    SHUTDOWN,
    distributed_backend,
    rank_device,
    run_worker_loop,
)


@pytest.mark.parametrize("device, backend", [("cpu", "gloo"), ("cuda", "nccl"), ("cuda:1", "nccl")])
def test_distributed_backend(device: str, backend: str) -> None:
    assert distributed_backend(device) == backend


@pytest.mark.parametrize("cores, ranks, threads", [(16, 1, 16), (16, 3, 5), (2, 4, 1)])
def test_cpu_ranks_share_the_cores(cores, ranks, threads, monkeypatch) -> None:
    """Formula: max(1, cores // ranks_on_host) threads each; the device stays as given."""
    calls = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    assert rank_device("cpu", 1, ranks) == "cpu"
    assert calls == [threads]


def test_cuda_rank_takes_the_gpu_of_its_local_rank(monkeypatch) -> None:
    devices, threads = [], []
    monkeypatch.setattr(torch.cuda, "set_device", devices.append)
    monkeypatch.setattr(torch, "set_num_threads", threads.append)
    assert rank_device("cuda", 2, 4) == "cuda:2"
    assert (devices, threads) == ([2], [])


class RecordingRunner:
    device = torch.device("cpu")
    follow = ModelRunner.follow
    shares_samples = False  # no async scheduling: nothing to receive after a step

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def init_kv_cache(self, num_blocks: int) -> None:
        self.calls.append(("init_kv_cache", num_blocks))

    def forward(self, step: object, intermediate: object = None) -> None:
        self.calls.append(("forward", step))

    def pool(self, step: object, intermediate: object = None) -> None:
        self.calls.append(("pool", step))


def follow(
    messages: list[tuple[str, object]], monkeypatch: pytest.MonkeyPatch
) -> tuple[RecordingRunner, list]:
    """Run the loop on `messages` as a tensor-parallel peer of rank 0 (which samples);
    returns the runner and the messages the loop did not take."""
    pending = list(messages)
    monkeypatch.setattr(StageLink, "receive_message", lambda _: pending.pop(0))
    monkeypatch.setattr(StageLink, "samples", False)
    runner = RecordingRunner()
    # no other rank here; the loop meets rank 0 in the barrier once SHUTDOWN is out
    monkeypatch.setattr(worker, "shutdown_barrier", lambda: runner.calls.append(("barrier",)))
    run_worker_loop(runner)
    return runner, pending


def test_worker_loop_runs_each_message_until_shutdown(monkeypatch) -> None:
    """Only rank 0 samples: EXECUTE runs the forward alone, or the pooling of a pooling
    model's step."""
    step, pooled = StepInput([], [], [0], []), StepInput([], [], [], [], pool_indices=[0])
    messages = [
        (INIT_KV_CACHE, 8),
        (EXECUTE, (step, None)),
        (EXECUTE, (pooled, None)),
        (SHUTDOWN, None),
    ]
    runner, pending = follow([*messages, (EXECUTE, (step, None))], monkeypatch)
    assert runner.calls == [
        ("init_kv_cache", 8),
        ("forward", step),
        ("pool", pooled),
        ("barrier",),
    ]
    assert pending == [(EXECUTE, (step, None))]


def test_worker_loop_rejects_an_unknown_message(monkeypatch) -> None:
    with pytest.raises(RuntimeError, match="unknown control message 'bogus'"):
        follow([(INIT_KV_CACHE, 8), ("bogus", None)], monkeypatch)
