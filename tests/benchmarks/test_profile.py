"""--profile's summary (pagedllm/benchmarks/profile.py). Reference: torch's own profiler
table, which sums the device time of device rows alone (profiler_util._build_table)."""

from types import SimpleNamespace

import pytest
import torch
from torch.autograd import DeviceType

from pagedllm.benchmarks import profile


def _row(key: str, device_type: DeviceType, self_us: float, **flags: bool) -> SimpleNamespace:
    return SimpleNamespace(
        key=key,
        count=1,
        device_type=device_type,
        is_legacy=flags.get("is_legacy", False),
        is_user_annotation=flags.get("is_user_annotation", False),
        self_device_time_total=self_us,
        self_cpu_time_total=1.0,
    )


class _FakeProfile:
    """torch.profiler.profile as a GPU run's key_averages() would come out of it: each
    kernel's time also on the CPU op that launched it, and an annotation spanning both."""

    def __init__(self, activities: list) -> None:
        assert torch.profiler.ProfilerActivity.CUDA in activities

    def __enter__(self) -> "_FakeProfile":
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def key_averages(self) -> list[SimpleNamespace]:
        return [
            _row("aten::mm", DeviceType.CPU, 300.0),
            _row("cudaGraphLaunch", DeviceType.CPU, 100.0),
            _row("sm90_gemm", DeviceType.CUDA, 300.0),
            _row("_attention_kernel", DeviceType.CUDA, 100.0),
            _row("step", DeviceType.CUDA, 450.0, is_user_annotation=True),
        ]


def test_gpu_busy_time_counts_each_kernel_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(profile, "profile", _FakeProfile)
    summary = profile.profile_summary(lambda: None)
    assert summary["device"] == "cuda" and summary["busy_us"] == 400.0
    assert summary["calls"] == 2  # the two kernels
    assert [op["name"] for op in summary["ops"]] == ["sm90_gemm", "_attention_kernel"]
    assert [op["share"] for op in summary["ops"]] == [0.75, 0.25]


def test_cpu_rows_of_the_legacy_profiler_hold_the_kernel_time() -> None:
    row = _row("aten::mm", DeviceType.CPU, 300.0, is_legacy=True)
    assert profile._self_time(row, device=True) == 300.0
    assert profile._self_time(row, device=False) == 1.0
