"""pagedllm/benchmarks/bandwidth.py: the bound is bandwidth / weight bytes (formula), read
from the kind of pages the weights lie in."""

import pathlib

import pytest
import torch

from pagedllm.benchmarks import bandwidth
from pagedllm.benchmarks.bandwidth import ReadBandwidthProbe, decode_bound_tokens_per_s
from pagedllm.cpu_memory import huge_page_size
from tests.devices import DEVICES
from tests.memory_maps import mapping_of


@pytest.mark.parametrize("device", DEVICES)
def test_probe_measures_each_time_it_is_called_over_one_tensor_made_at_the_first(
    device: str,
) -> None:
    """On the engine's device."""
    probe = ReadBandwidthProbe(8 * 1024**2, repeats=2, device=device)
    assert probe.data is None  # nothing faulted in while a backend starts
    assert probe() > 0
    data = probe.data
    assert data is not None and data.numel() * 4 == 8 * 1024**2
    assert data.device.type == device
    assert probe() > 0 and probe.data is data


def test_probe_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError, match="num_bytes 0"):
        ReadBandwidthProbe(0)
    with pytest.raises(ValueError, match="repeats 0"):
        ReadBandwidthProbe(1024, repeats=0)


def test_decode_bound() -> None:
    assert decode_bound_tokens_per_s(20e9, 500_000_000) == 40.0
    assert decode_bound_tokens_per_s(20e9, 500_000_000, batch_size=4) == 160.0


@pytest.mark.skipif(
    huge_page_size() is None or not pathlib.Path("/proc/self/smaps").exists(),
    reason="the OS offers no transparent huge pages",
)
def test_probe_reads_huge_pages_as_the_weight_arena_does() -> None:
    data = bandwidth.probe_tensor(3 * 1024**2)
    assert data.dtype == torch.float32 and data.numel() == 3 * 1024**2
    assert bool((data == 1).all())
    assert data.data_ptr() % huge_page_size() == 0
    assert " hg" in mapping_of(data.data_ptr())[1]  # MADV_HUGEPAGE


def test_probe_without_huge_pages_is_a_plain_tensor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bandwidth, "huge_page_size", lambda: None)
    data = bandwidth.probe_tensor(1000)
    assert data.numel() == 1000 and bool((data == 1).all())
    assert ReadBandwidthProbe(8 * 1024**2, repeats=2)() > 0
