"""Tensor-parallel worker helpers (pagedllm/executor/worker.py). Reference: their contracts:
NCCL for CUDA devices and gloo otherwise; a CUDA rank on GPU local_rank, CPU ranks sharing the
cores; the control loop doing what rank 0 broadcasts until it says shutdown."""

import os

import pytest
import torch

from pagedllm.executor import worker
from pagedllm.executor.model_runner import StepInput
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
    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def init_kv_cache(self, num_blocks: int) -> None:
        self.calls.append(("init_kv_cache", num_blocks))

    def forward(self, step: object) -> None:
        self.calls.append(("forward", step))

    def pool(self, step: object) -> None:
        self.calls.append(("pool", step))


def follow(
    messages: list[tuple[str, object]], monkeypatch: pytest.MonkeyPatch
) -> tuple[RecordingRunner, list]:
    """Run the loop on `messages` as rank 0's broadcasts; returns the runner and the
    messages the loop did not take."""
    pending = list(messages)

    def receive(message: None) -> tuple[str, object]:
        assert message is None  # a worker only receives
        return pending.pop(0)

    monkeypatch.setattr(worker, "broadcast_message", receive)
    monkeypatch.setattr(worker, "shutdown_barrier", lambda: None)  # no other rank here
    runner = RecordingRunner()
    run_worker_loop(runner)
    return runner, pending


def test_worker_loop_runs_each_message_until_shutdown(monkeypatch) -> None:
    """Only rank 0 samples: EXECUTE runs the forward alone, or the pooling of a pooling
    model's step."""
    step, pooled = StepInput([], [], [0], []), StepInput([], [], [], [], pool_indices=[0])
    messages = [(INIT_KV_CACHE, 8), (EXECUTE, step), (EXECUTE, pooled), (SHUTDOWN, None)]
    runner, pending = follow([*messages, (EXECUTE, step)], monkeypatch)
    assert runner.calls == [("init_kv_cache", 8), ("forward", step), ("pool", pooled)]
    assert pending == [(EXECUTE, step)]


def test_worker_loop_rejects_an_unknown_message(monkeypatch) -> None:
    with pytest.raises(RuntimeError, match="unknown control message 'bogus'"):
        follow([(INIT_KV_CACHE, 8), ("bogus", None)], monkeypatch)
