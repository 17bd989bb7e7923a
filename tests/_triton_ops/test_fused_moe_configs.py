"""The block-size table and vLLM's default rule (fused_moe_configs)."""

import pytest
import torch

from pagedllm._triton_ops import fused_moe_configs
from pagedllm._triton_ops.fused_moe_configs import _TUNED, get_config, get_default_config

CUDA = torch.device("cuda")


def test_default_rule_small_batches_take_small_blocks() -> None:
    """Reference: vLLM's get_default_config for unquantized weights."""
    assert get_default_config(8, 8, torch.bfloat16)["BLOCK_SIZE_M"] == 16
    large = get_default_config(9, 8, torch.bfloat16)
    assert (large["BLOCK_SIZE_M"], large["BLOCK_SIZE_N"], large["BLOCK_SIZE_K"]) == (64, 64, 32)
    assert get_default_config(9, 8, torch.float32)["BLOCK_SIZE_K"] == 16


def test_table_row_nearest_batch_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fused_moe_configs, "device_name", lambda device: "NVIDIA_H200")
    row = _TUNED[(128, 768, "NVIDIA_H200")]
    assert get_config(20, 128, 768, torch.bfloat16, CUDA) == row[16]
    assert get_config(3000, 128, 768, torch.bfloat16, CUDA) == row[3072]
    assert get_config(9000, 128, 768, torch.bfloat16, CUDA) == row[4096]
    assert get_config(20, 128, 768, torch.float32, CUDA) == get_default_config(
        20, 128, torch.float32
    )
    assert get_config(20, 64, 768, torch.bfloat16, CUDA) == get_default_config(
        20, 64, torch.bfloat16
    )


def test_table_entries_are_launchable() -> None:
    """Every config names the kernel's meta-parameters; blocks are powers of two of at least
    16 (tl.dot's smallest tile)."""
    for row in _TUNED.values():
        for config in row.values():
            assert set(config) == {
                "BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps",
                "num_stages",
            }  # fmt: skip
            for name in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K"):
                assert config[name] >= 16 and config[name] & (config[name] - 1) == 0
