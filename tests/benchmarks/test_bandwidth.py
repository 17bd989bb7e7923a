"""pagedllm/benchmarks/bandwidth.py: the bound is bandwidth / bytes a step reads (formula;
a MoE layer's experts counted as far as a batch routes to them), read from the kind of pages
the weights lie in."""

import pathlib
from collections.abc import Callable

import pytest
import torch

from pagedllm.benchmarks import bandwidth
from pagedllm.benchmarks.bandwidth import (
    ReadBandwidthProbe,
    decode_bound_tokens_per_s,
    expected_active_experts,
    model_weight_bytes,
)
from pagedllm.config import ModelConfig
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


def test_expected_active_experts() -> None:
    assert expected_active_experts(128, 8, 1) == pytest.approx(8)
    assert expected_active_experts(8, 2, 2) == pytest.approx(8 * (1 - 0.75**2))  # 3.5
    assert expected_active_experts(128, 8, 1000) == pytest.approx(128)
    assert expected_active_experts(4, 4, 3) == 4


def _embedding_row_bytes(config: ModelConfig) -> int:
    return config.hf_config.hidden_size * 4  # float32


def test_a_moe_step_reads_the_routed_experts_and_every_other_weight(
    tiny_model_path: Callable[[str], str],
) -> None:
    """Tiny Qwen3-MoE: 8 experts, top 2, in one of its two layers (the other is dense); its
    input embedding (320 rows, untied) is looked up, a row per token."""
    config = ModelConfig.create(tiny_model_path("qwen3-moe"), "float32")
    everything, one_token = model_weight_bytes(config, batch_size=1)
    hf = config.hf_config
    expert = 3 * hf.hidden_size * hf.moe_intermediate_size * 4  # gate, up, down in float32
    unread_rows = 319 * _embedding_row_bytes(config)
    assert everything - one_token == (8 - 2) * expert + unread_rows  # 6 experts not read
    _, two_tokens = model_weight_bytes(config, batch_size=2)
    row = _embedding_row_bytes(config)
    assert two_tokens - one_token == round((3.5 - 2) * expert) + row


def test_a_dense_step_reads_every_weight_but_an_untied_embedding_s_unused_rows(
    tiny_model_path: Callable[[str], str],
) -> None:
    """Tied, the embedding is the LM head's weight, which every step streams."""
    tied = ModelConfig.create(tiny_model_path("llama-tied-mqa"), "float32")
    assert len(set(model_weight_bytes(tied, batch_size=4))) == 1
    untied = ModelConfig.create(tiny_model_path("llama-gqa-llama3"), "float32")
    everything, four_tokens = model_weight_bytes(untied, batch_size=4)
    assert everything - four_tokens == (320 - 4) * _embedding_row_bytes(untied)


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
