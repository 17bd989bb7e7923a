"""`pagedllm inspect` against sizes computed by hand from the target models' configs."""

import json
from pathlib import Path

import pytest

from pagedllm.config import ModelConfig
from pagedllm.entrypoints.cli import main
from pagedllm.entrypoints.inspect import inspect_model

CONFIGS = Path(__file__).parents[1] / "fixtures" / "configs"
LLAMA_70B = str(CONFIGS / "DeepSeek-R1-Distill-Llama-70B.json")
QWEN3_MOE = str(CONFIGS / "Qwen3-30B-A3B-Instruct-2507.json")
MIXTRAL = str(CONFIGS / "Mixtral-8x7B-Instruct-v0.1.json")


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
    assert report["kv_cache_dtype"] == "bfloat16"


def test_kv_cache_dtype_sets_the_kv_bytes_not_the_weights() -> None:
    config = ModelConfig.create(LLAMA_70B, dtype="bfloat16")
    report = inspect_model(config, tp=1, kv_cache_dtype="float32")
    assert report["kv_cache_dtype"] == "float32"
    assert report["kv_cache_bytes_per_token"] == 2 * 80 * 8 * 128 * 4
    assert report["bytes_per_rank"] == inspect_model(config)["bytes_per_rank"]
    fp8 = inspect_model(config, tp=1, kv_cache_dtype="fp8")
    assert fp8["kv_cache_bytes_per_token"] == 2 * 80 * 8 * 128
    with pytest.raises(ValueError, match="kv_cache_dtype 'fp8_e5m2' is not supported"):
        inspect_model(config, kv_cache_dtype="fp8_e5m2")


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


def test_mixtral_total_and_active() -> None:
    """Mixtral-8x7B by hand: hidden 4096, 32 q / 8 kv heads of 128, 8 experts of 14336
    (top-2) in each of 32 layers, vocab 32000, untied: 46.7B parameters, 12.9B active."""
    hidden, kv_dim, expert = 4096, 8 * 128, 3 * 4096 * 14336
    dense = hidden * hidden * 2 + hidden * kv_dim * 2 + 2 * hidden + hidden * 8  # router
    embeddings = 2 * 32000 * hidden + hidden
    report = inspect_model(ModelConfig.create(MIXTRAL, dtype="bfloat16"), tp=1)
    assert report["total_params"] == 32 * (dense + 8 * expert) + embeddings == 46_702_792_704
    assert report["active_params"] == 32 * (dense + 2 * expert) + embeddings == 12_879_925_248


def test_mixtral_q4_k_m_gives_its_attention_more_bits() -> None:
    """llama.cpp's rule for a model of exactly 8 experts: attn_k and attn_v Q8_0, attn_output
    Q5_K, in every layer."""
    config = ModelConfig.create(MIXTRAL, dtype="bfloat16")
    by_type = inspect_model(config, tp=1, quantization="q4_k_m")["bytes_per_rank_by_type"]
    assert by_type["Q8_0"] == nbytes(32 * 2 * 1024 * 4096, Q8_0)
    assert by_type["Q5_K"] == nbytes(32 * 4096 * 4096, Q5_K)


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
    main(["inspect", LLAMA_70B, "--tp", "2", "--dtype", "float32", "--kv-cache-dtype", "bfloat16"])
    text = capsys.readouterr().out
    assert "70,553,706,496" in text and "163,840 bytes (bfloat16)" in text


def test_cli_rejects_a_tp_that_does_not_divide_heads(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        main(["inspect", LLAMA_70B, "--tp", "3"])
    assert "not divisible by tensor parallel size 3" in capsys.readouterr().err


# Bytes per block by hand (the block layouts in csrc/gguf.h): bytes = weights / block * size.
Q4_K, Q5_K, Q6_K, Q8_0 = (256, 144), (256, 176), (256, 210), (32, 34)


def nbytes(weights: int, block: tuple[int, int]) -> int:
    assert weights % block[0] == 0, "a rank's weights are whole blocks"
    return weights // block[0] * block[1]


def llama_70b_rank(tp: int) -> dict[str, int]:
    """Weights one of tp ranks holds, by role: q and o split by heads (64 / tp of 128), k or
    v one kv head per rank at tp 8, gate/up/down split 28672 / tp, vocab 128256 padded to a
    multiple of 64 * tp and split, norms whole."""
    hidden, heads, kv_heads = 8192, 64 // tp, max(8 // tp, 1)
    vocab_rows = -(-128256 // (64 * tp)) * 64
    return {
        "q": hidden * heads * 128,  # q_proj, and the same for o_proj
        "kv": hidden * kv_heads * 128,  # k_proj or v_proj
        "mlp": hidden * 28672 // tp,  # gate_proj, up_proj or down_proj
        "vocab": vocab_rows * hidden,  # embedding or LM head
        "norms": (2 * 80 + 1) * hidden,
    }


def qwen3_moe_rank(tp: int) -> dict[str, int]:
    """As llama_70b_rank for Qwen3-30B-A3B: 32 / tp q heads, 4 kv heads (one per rank from
    tp 4), each of 128 experts' intermediate 768 split by tp, router replicated."""
    hidden, heads, kv_heads = 2048, 32 // tp, max(4 // tp, 1)
    vocab_rows = -(-151936 // (64 * tp)) * 64
    return {
        "q": hidden * heads * 128,
        "kv": hidden * kv_heads * 128,
        "experts": 128 * hidden * 768 // tp,  # the gate (or up, or down) of all 128 experts
        "router": 128 * hidden,
        "vocab": vocab_rows * hidden,
        "norms": 48 * (2 * hidden + 2 * 128) + hidden,
    }


def llama_70b_quantized(tp: int) -> dict[str, int]:
    """Bytes per rank: Q4_K by default; v and down Q6_K in the 40 of 80 layers llama.cpp's
    use_more_bits picks, the other 40 v Q5_K (its 70B rule); LM head Q6_K; norms F32."""
    r = llama_70b_rank(tp)
    q4_k = 80 * (2 * r["q"] + r["kv"] + 2 * r["mlp"]) + 40 * r["mlp"] + r["vocab"]
    q6_k = 40 * (r["kv"] + r["mlp"]) + r["vocab"]
    linears = 80 * (2 * r["q"] + 2 * r["kv"] + 3 * r["mlp"]) + 2 * r["vocab"]
    return {
        "q4_k_m": nbytes(q4_k, Q4_K)
        + nbytes(40 * r["kv"], Q5_K)
        + nbytes(q6_k, Q6_K)
        + 4 * r["norms"],
        "q8_0": nbytes(linears, Q8_0) + 4 * r["norms"],
        "int8": nbytes(linears, Q8_0) + 2 * r["norms"],  # norms in bf16
    }


def qwen3_moe_quantized(tp: int) -> dict[str, int]:
    """As llama_70b_quantized: 24 of 48 layers get Q6_K v and expert down_proj (no 70B
    rule); the router stays float: F32 in a GGUF, bf16 in int8."""
    r = qwen3_moe_rank(tp)
    q4_k = 48 * (2 * r["q"] + r["kv"] + 2 * r["experts"]) + 24 * (r["kv"] + r["experts"])
    q6_k = 24 * (r["kv"] + r["experts"]) + r["vocab"]
    linears = 48 * (2 * r["q"] + 2 * r["kv"] + 3 * r["experts"]) + 2 * r["vocab"]
    floats = 48 * r["router"] + r["norms"]
    return {
        "q4_k_m": nbytes(q4_k + r["vocab"], Q4_K) + nbytes(q6_k, Q6_K) + 4 * floats,
        "q8_0": nbytes(linears, Q8_0) + 4 * floats,
        "int8": nbytes(linears, Q8_0) + 2 * floats,
    }


@pytest.mark.parametrize("quantization", ["q4_k_m", "q8_0", "int8"])
@pytest.mark.parametrize("tp", [1, 8])
def test_llama_70b_quantized_bytes_per_rank(quantization: str, tp: int) -> None:
    report = inspect_model(ModelConfig.create(LLAMA_70B, dtype="bfloat16"), tp, quantization)
    assert report["bytes_per_rank"] == llama_70b_quantized(tp)[quantization]
    assert report["total_weight_bytes"] == llama_70b_quantized(1)[quantization]
    assert report["total_params"] == 70_553_706_496  # the other figures stay


@pytest.mark.parametrize(
    "quantization, tp", [("q4_k_m", 1), ("q8_0", 1), ("int8", 1), ("q8_0", 8), ("int8", 8)]
)
def test_qwen3_moe_quantized_bytes_per_rank(quantization: str, tp: int) -> None:
    """No tp > 1 splits Q4_K_M whole: the experts' down_proj rows of 768 are 3 blocks."""
    report = inspect_model(ModelConfig.create(QWEN3_MOE, dtype="bfloat16"), tp, quantization)
    assert report["bytes_per_rank"] == qwen3_moe_quantized(tp)[quantization]
    assert report["total_weight_bytes"] == qwen3_moe_quantized(1)[quantization]


def test_llama_70b_q4_k_m_within_3_percent_of_the_real_file() -> None:
    """DeepSeek-R1-Distill-Llama-70B-Q4_K_M.gguf: 42.52 GB of tensors and metadata."""
    report = inspect_model(ModelConfig.create(LLAMA_70B), quantization="q4_k_m")
    assert abs(report["total_weight_bytes"] - 42.5e9) / 42.5e9 < 0.03
    assert report["bytes_per_rank_by_type"] == {
        "F32": 161 * 8192 * 4,
        "Q4_K": 33_432_403_968,
        "Q5_K": 40 * 1024 * 8192 // 256 * 176,  # v alone: the fused qkv_proj was split
        "Q6_K": 8_844_165_120,
    }


@pytest.mark.parametrize(
    "config, tp, tensor, values",
    [
        (LLAMA_70B, 32, "model.layers.0.mlp.down_proj.weight", 896),  # 28672 / 32
        (QWEN3_MOE, 2, "model.layers.0.mlp.experts.0.down_proj.weight", 384),  # 768 / 2
    ],
)
def test_a_tp_that_cuts_blocks_is_an_error(config: str, tp: int, tensor: str, values: int) -> None:
    """Q6_K blocks of 256 (down_proj of layer 0 gets more bits): a row-parallel shard must
    hold whole blocks."""
    match = f"tensor parallel size {tp} cuts Q6_K blocks of 256 in {tensor}: "
    with pytest.raises(ValueError, match=match) as error:
        inspect_model(ModelConfig.create(config), tp, "q4_k_m")
    assert f"its rows of {values * tp} split into {values} values per rank" in str(error.value)


def test_cli_quantization_json_and_text(capsys: pytest.CaptureFixture) -> None:
    main(["inspect", LLAMA_70B, "--quantization", "q4_k_m", "--tp", "8", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["quantization"] == "q4_k_m"
    assert report["bytes_per_rank"] == llama_70b_quantized(8)["q4_k_m"]
    assert set(report["bytes_per_rank_by_type"]) == {"F32", "Q4_K", "Q5_K", "Q6_K"}
    main(["inspect", QWEN3_MOE, "--quantization", "int8"])
    text = capsys.readouterr().out
    assert "quantization            int8" in text
    assert f"weight bytes per rank   {qwen3_moe_quantized(1)['int8']:,}" in text
    assert "  Q8_0" in text and "  BF16" in text


def test_cli_names_the_tensor_a_tp_cuts(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        main(["inspect", QWEN3_MOE, "--quantization", "q4_k_m", "--tp", "2"])
    err = capsys.readouterr().err
    assert "tensor parallel size 2 cuts Q6_K blocks of 256" in err
    assert "model.layers.0.mlp.experts.0.down_proj.weight" in err


def test_llama_70b_pp2_tp4_bytes_per_rank_by_stage() -> None:
    """By hand: each stage 40 of the 80 layers at tp 4; the embedding on stage 0, the final
    norm and LM head on stage 1; the KV cache of 40 layers, 2 kv heads a rank."""
    r = llama_70b_rank(4)
    layer = 2 * r["q"] + 2 * r["kv"] + 3 * r["mlp"] + 2 * 8192
    first, last = 40 * layer + r["vocab"], 40 * layer + 8192 + r["vocab"]
    report = inspect_model(ModelConfig.create(LLAMA_70B, dtype="bfloat16"), tp=4, pp=2)
    assert report["bytes_per_rank_by_stage"] == [2 * first, 2 * last]
    assert report["bytes_per_rank"] == 2 * last
    assert report["kv_cache_bytes_per_token"] == 2 * 40 * 2 * 128 * 2
    assert report["total_weight_bytes"] == 2 * llama_70b_params()[0]


def test_llama_70b_pp2_quantized_stages_add_up_to_one_stage() -> None:
    """Untied, no tensor is on two stages: their bytes add up to the pp 1 figure."""
    config = ModelConfig.create(LLAMA_70B, dtype="bfloat16")
    report = inspect_model(config, tp=4, quantization="q4_k_m", pp=2)
    assert sum(report["bytes_per_rank_by_stage"]) == llama_70b_quantized(4)["q4_k_m"]
    assert report["bytes_per_rank"] == max(report["bytes_per_rank_by_stage"])
    assert sum(report["bytes_per_rank_by_type"].values()) == report["bytes_per_rank"]
    assert report["total_weight_bytes"] == llama_70b_quantized(1)["q4_k_m"]


def test_cli_pipeline_parallel_size(capsys: pytest.CaptureFixture) -> None:
    main(["inspect", LLAMA_70B, "-tp", "4", "--pipeline-parallel-size", "2", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert (report["tensor_parallel_size"], report["pipeline_parallel_size"]) == (4, 2)
    main(["inspect", LLAMA_70B, "--tp", "4", "-pp", "2"])
    text = capsys.readouterr().out
    assert "pipeline parallel size  2" in text
    stage_1 = next(line for line in text.splitlines() if line.startswith("  stage 1 rank"))
    assert f"{report['bytes_per_rank_by_stage'][1]:,} (" in stage_1
    with pytest.raises(SystemExit):
        main(["inspect", LLAMA_70B, "-pp", "81"])
    assert "pipeline_parallel_size 81 is more than the model's 80 layers" in capsys.readouterr().err


def test_qwen3_moe_q4_k_m_over_4_ranks_with_expert_parallelism() -> None:
    """Refused as tensor parallel (Q6_K down_proj rows of 768 split into 192); with
    enable_expert_parallel each rank holds 32 of the 128 experts whole, the same number of
    expert weights as a quarter of each, in whole blocks, so the hand count above holds."""
    config = ModelConfig.create(QWEN3_MOE, dtype="bfloat16")
    with pytest.raises(ValueError, match="or --enable-expert-parallel"):
        inspect_model(config, 4, "q4_k_m")
    report = inspect_model(config, 4, "q4_k_m", enable_expert_parallel=True)
    assert report["enable_expert_parallel"] is True
    assert report["bytes_per_rank"] == qwen3_moe_quantized(4)["q4_k_m"]
    assert report["total_weight_bytes"] == qwen3_moe_quantized(1)["q4_k_m"]
    float_report = inspect_model(config, 4, enable_expert_parallel=True)
    assert float_report["bytes_per_rank"] == inspect_model(config, 4)["bytes_per_rank"]


def test_cli_expert_parallel(capsys: pytest.CaptureFixture) -> None:
    argv = ["inspect", QWEN3_MOE, "--quantization", "q4_k_m", "--tp", "4"]
    main([*argv, "--enable-expert-parallel", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["bytes_per_rank"] == qwen3_moe_quantized(4)["q4_k_m"]
    main([*argv, "--enable-expert-parallel"])
    assert "expert parallel         on" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(argv)
    assert "tensor parallel size 4 cuts Q6_K blocks of 256" in capsys.readouterr().err


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_tied_head_counts_as_the_loader_holds_it(dtype: str, tiny_model_path) -> None:
    """Reference: the loaded model's bytes. Where this CPU's linear kernel reads a packed
    order (float32 on AVX2, bfloat16 on AVX-512 BF16 or AMX), a tied LM head keeps a packed
    copy beside the embedding's rows, which the report counts; elsewhere both lack it."""
    from pagedllm.model_loader.loader import get_model, weight_bytes

    config = ModelConfig.create(tiny_model_path("llama-tied-mqa"), dtype)
    model = get_model(config)
    assert inspect_model(config)["bytes_per_rank"] == weight_bytes(model, buffers=False)
