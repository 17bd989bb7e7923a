"""pagedllm/executor/gpu_memory.py: vLLM's gpu_memory_utilization rule, on given snapshots
(the CUDA figures are tested where a GPU is, in tests/executor/test_model_runner.py)."""

import pytest

from pagedllm.executor.gpu_memory import (
    GiB,
    KVCacheBudget,
    MemorySnapshot,
    check_free_memory,
    kv_cache_budget,
)


def snapshot(free: float, allocated: float = 0, reserved: float = 0) -> MemorySnapshot:
    return MemorySnapshot(int(free * GiB), 100 * GiB, int(allocated * GiB), int(reserved * GiB))


def test_the_engine_starts_only_with_its_share_free() -> None:
    check_free_memory(snapshot(free=90), 0.9)
    with pytest.raises(ValueError, match=r"89.00 GiB free of 100.00 GiB.*0.9 of it \(90.00"):
        check_free_memory(snapshot(free=89), 0.9)


def test_the_kv_cache_takes_what_weights_peak_and_non_torch_memory_leave() -> None:
    """90 GiB asked; 16 of weights, a peak 3 above them, 1.5 taken outside torch."""
    start = snapshot(free=95, allocated=0.5, reserved=1)
    loaded = snapshot(free=79, allocated=16.5, reserved=17)
    # The profile's memory returned to the device: torch keeps the weights' 17 reserved.
    after = snapshot(free=77.5, allocated=16.5, reserved=17)
    budget = kv_cache_budget(start, loaded, int(19.5 * GiB), after, 0.9)
    assert budget == KVCacheBudget(
        kv_cache=int(69.5 * GiB),
        weights=16 * GiB,
        peak_activations=3 * GiB,
        non_torch=int(1.5 * GiB),
        requested=90 * GiB,
    )
    assert budget.describe().startswith("69.50 GiB for the KV cache of 90.00 GiB")


def test_never_more_than_is_free_and_negative_when_nothing_is_left() -> None:
    start, loaded = snapshot(free=95), snapshot(free=75, allocated=20, reserved=20)
    after = snapshot(free=60, allocated=20, reserved=20)  # 15 GiB taken outside torch
    assert kv_cache_budget(start, loaded, 20 * GiB, after, 1.0).kv_cache == 60 * GiB
    assert kv_cache_budget(start, loaded, 20 * GiB, after, 0.3).kv_cache == -5 * GiB
