"""`pagedllm inspect` against sizes computed by hand from the two target models' configs."""

import json
from pathlib import Path

import pytest

from pagedllm.config import ModelConfig
from pagedllm.entrypoints.cli import main
from pagedllm.entrypoints.inspect import inspect_model

CONFIGS = Path(__file__).parents[1] / "fixtures" / "configs"
LLAMA_70B = str(CONFIGS / "DeepSeek-R1-Distill-Llama-70B.json")
QWEN3_MOE = str(CONFIGS / "Qwen3-30B-A3B-Instruct-2507.json")


def llama_70b_params() -> tuple[int, int]:
    """(total params, per-layer params) of the 70B by hand: hidden 8192, 64 q and 8 kv heads
    of 128, intermediate 28672, 80 layers, vocab 128256, untied."""
    hidden, inter, kv_dim = 8192, 28672, 8 * 128
    attn = hidden * hidden * 2 + hidden * kv_dim * 2
    layer = attn + 3 * hidden * inter + 2 * hidden
    return 80 * layer + 2 * 128256 * hidden + hidden, layer


def qwen3_moe_params() -> tuple[int, int]:
    """(total, active) for Qwen3-30B-A3B: hidden 2048, 32 q / 4 kv heads of 128 with q/k
    norm, 128 experts of 768 (top-8), 48 layers, vocab 151936, untied."""
    hidden, q_dim, kv_dim, expert = 2048, 32 * 128, 4 * 128, 3 * 2048 * 768
    attn = hidden * q_dim * 2 + hidden * kv_dim * 2 + 2 * 128
    dense = attn + 2 * hidden + hidden * 128  # norms and router
    embeddings = 2 * 151936 * hidden + hidden
    return 48 * (dense + 128 * expert) + embeddings, 48 * (dense + 8 * expert) + embeddings


def test_llama_70b_sizes_bf16() -> None:
    total, layer = llama_70b_params()
    report = inspect_model(ModelConfig.create(LLAMA_70B, dtype="bfloat16"), tp=1)
    assert report["total_params"] == total == 70_553_706_496
    assert report["active_params"] == total
    assert report["bytes_per_rank"] == 2 * total
    assert report["kv_cache_bytes_per_token"] == 2 * 80 * 8 * 128 * 2


def test_llama_70b_tp8_shards_everything_but_norms() -> None:
    total, _ = llama_70b_params()
    norms = 80 * 2 * 8192 + 8192
    vocab_per_rank = 128512 // 8  # 128256 padded to a multiple of 64 * 8
    report = inspect_model(ModelConfig.create(LLAMA_70B, dtype="bfloat16"), tp=8)
    expected = (total - norms - 2 * 128256 * 8192) // 8 + norms + 2 * vocab_per_rank * 8192
    assert report["bytes_per_rank"] == 2 * expected
    assert report["kv_cache_bytes_per_token"] == 2 * 80 * 1 * 128 * 2


def test_qwen3_moe_total_and_active() -> None:
    total, active = qwen3_moe_params()
    report = inspect_model(ModelConfig.create(QWEN3_MOE, dtype="bfloat16"), tp=1)
    assert report["total_params"] == total == 30_532_122_624
    assert report["active_params"] == active == 3_353_032_704
    assert report["kv_cache_bytes_per_token"] == 2 * 48 * 4 * 128 * 2


def test_qwen3_moe_tp8_replicates_kv_heads() -> None:
    """4 kv heads over 8 ranks: each rank holds one (replicated) kv head."""
    report = inspect_model(ModelConfig.create(QWEN3_MOE, dtype="bfloat16"), tp=8)
    assert report["kv_cache_bytes_per_token"] == 2 * 48 * 1 * 128 * 2
    hidden = 2048
    per_layer = (
        hidden * 4 * 128 * 2  # q (4 of 32 heads) and o
        + hidden * 128 * 2  # k and v: one kv head
        + 2 * 128  # q/k norm
        + 2 * hidden  # layer norms
        + hidden * 128  # router (replicated)
        + 128 * 3 * hidden * 96  # experts, intermediate 768 / 8
    )
    embeddings = 2 * (152064 // 8) * hidden + hidden  # vocab padded to a multiple of 512
    assert report["bytes_per_rank"] == 2 * (48 * per_layer + embeddings)


def test_cli_json_and_text(capsys: pytest.CaptureFixture) -> None:
    main(["inspect", QWEN3_MOE, "--json"])
    report = json.loads(capsys.readouterr().out)
    assert {"total_params", "active_params", "bytes_per_rank", "kv_cache_bytes_per_token"} <= set(
        report
    )
    assert report["dtype"] == "bfloat16"  # the checkpoint's dtype by default
    main(["inspect", LLAMA_70B, "--tp", "2", "--dtype", "float32"])
    assert "70,553,706,496" in capsys.readouterr().out


def test_cli_rejects_a_tp_that_does_not_divide_heads(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        main(["inspect", LLAMA_70B, "--tp", "3"])
    assert "not divisible by tensor parallel size 3" in capsys.readouterr().err
