"""The quantization plans against llama.cpp's rules (src/llama-quant.cpp, llama_tensor_get_type)
and against the two seed models' tensor bytes counted by hand from their configs."""

import pytest
from gguf import GGMLQuantizationType as Q

from pagedllm.gguf.quant_plan import PlanModel, tensor_bytes, tensor_type, use_more_bits

# bytes per block, by hand (the block layouts in csrc/gguf.h): (weights per block, bytes)
BLOCKS = {"Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210), "Q8_0": (32, 34)}
BLOCKS |= {"F32": (1, 4), "BF16": (1, 2)}

LLAMA_70B = PlanModel("llama", num_layers=80, num_heads=64, num_kv_heads=8)
QWEN3_MOE = PlanModel("qwen3_moe", num_layers=48, num_heads=32, num_kv_heads=4, num_experts=128)

Tensors = list[tuple[str, tuple[int, ...]]]


def llama_70b_tensors() -> Tensors:
    """The checkpoint of DeepSeek-R1-Distill-Llama-70B: hidden 8192, 64 q and 8 kv heads of
    128, intermediate 28672, 80 layers, vocab 128256, untied."""
    hidden, inter, kv = 8192, 28672, 8 * 128
    tensors = [("model.embed_tokens.weight", (128256, hidden))]
    for i in range(80):
        layer = f"model.layers.{i}"
        tensors += [
            (f"{layer}.input_layernorm.weight", (hidden,)),
            (f"{layer}.self_attn.q_proj.weight", (hidden, hidden)),
            (f"{layer}.self_attn.k_proj.weight", (kv, hidden)),
            (f"{layer}.self_attn.v_proj.weight", (kv, hidden)),
            (f"{layer}.self_attn.o_proj.weight", (hidden, hidden)),
            (f"{layer}.post_attention_layernorm.weight", (hidden,)),
            (f"{layer}.mlp.gate_proj.weight", (inter, hidden)),
            (f"{layer}.mlp.up_proj.weight", (inter, hidden)),
            (f"{layer}.mlp.down_proj.weight", (hidden, inter)),
        ]
    return tensors + [("model.norm.weight", (hidden,)), ("lm_head.weight", (128256, hidden))]


def qwen3_moe_tensors() -> Tensors:
    """The checkpoint of Qwen3-30B-A3B: hidden 2048, 32 q / 4 kv heads of 128 with q/k norm,
    a router over 128 experts of 768, 48 layers, vocab 151936, untied."""
    hidden, expert = 2048, 768
    tensors = [("model.embed_tokens.weight", (151936, hidden))]
    for i in range(48):
        layer = f"model.layers.{i}"
        tensors += [
            (f"{layer}.input_layernorm.weight", (hidden,)),
            (f"{layer}.self_attn.q_proj.weight", (32 * 128, hidden)),
            (f"{layer}.self_attn.k_proj.weight", (4 * 128, hidden)),
            (f"{layer}.self_attn.v_proj.weight", (4 * 128, hidden)),
            (f"{layer}.self_attn.o_proj.weight", (hidden, 32 * 128)),
            (f"{layer}.self_attn.q_norm.weight", (128,)),
            (f"{layer}.self_attn.k_norm.weight", (128,)),
            (f"{layer}.post_attention_layernorm.weight", (hidden,)),
            (f"{layer}.mlp.gate.weight", (128, hidden)),
        ]
        for e in range(128):
            tensors += [
                (f"{layer}.mlp.experts.{e}.gate_proj.weight", (expert, hidden)),
                (f"{layer}.mlp.experts.{e}.up_proj.weight", (expert, hidden)),
                (f"{layer}.mlp.experts.{e}.down_proj.weight", (hidden, expert)),
            ]
    return tensors + [("model.norm.weight", (hidden,)), ("lm_head.weight", (151936, hidden))]


def weights_by_type(file_type: str, tensors: Tensors, model: PlanModel) -> dict[str, int]:
    counts: dict[str, int] = {}
    for name, shape in tensors:
        numel = 1
        for size in shape:
            numel *= size
        qtype = tensor_type(file_type, name, shape, model).name
        counts[qtype] = counts.get(qtype, 0) + numel
    return counts


def nbytes(weights_by_type: dict[str, int]) -> int:
    """Bytes by hand: weights / block size * bytes per block, for each type."""
    total = 0
    for qtype, weights in weights_by_type.items():
        block, size = BLOCKS[qtype]
        assert weights % block == 0
        total += weights // block * size
    return total


def plan_bytes(file_type: str, tensors: Tensors, model: PlanModel) -> int:
    return sum(tensor_bytes(tensor_type(file_type, n, s, model), s) for n, s in tensors)


# Weights of each role of the 70B, per layer unless named otherwise.
L70_Q = L70_O = 8192 * 8192
L70_KV = 1024 * 8192  # k or v
L70_MLP = 28672 * 8192  # gate, up or down
L70_VOCAB = 128256 * 8192  # embedding or LM head
L70_NORMS = (2 * 80 + 1) * 8192


def test_use_more_bits_picks_half_the_layers_as_llama_cpp() -> None:
    """i < n/8, i >= 7n/8, or (i - n/8) % 3 == 2: 10 + 10 + 20 of 80 layers, 6 + 6 + 12 of 48."""
    picked = [i for i in range(80) if use_more_bits(i, 80)]
    assert picked == [*range(10), *range(12, 70, 3), *range(70, 80)]
    assert len(picked) == 40
    assert [i for i in range(48) if use_more_bits(i, 48)] == [
        *range(6),
        *range(8, 42, 3),
        *range(42, 48),
    ]


def test_llama_70b_q4_k_m_types_by_hand() -> None:
    """Q6_K: LM head, v and down in the 40 more-bits layers; Q5_K: the other 40 v (the 70B
    rule); Q4_K: the rest, the untied embedding included; F32: norms."""
    assert weights_by_type("q4_k_m", llama_70b_tensors(), LLAMA_70B) == {
        "Q4_K": 80 * (L70_Q + L70_KV + L70_O + 2 * L70_MLP) + 40 * L70_MLP + L70_VOCAB,
        "Q5_K": 40 * L70_KV,
        "Q6_K": 40 * (L70_KV + L70_MLP) + L70_VOCAB,
        "F32": L70_NORMS,
    }


def test_llama_70b_q4_k_m_bytes_match_the_real_file() -> None:
    """DeepSeek-R1-Distill-Llama-70B-Q4_K_M.gguf is 42.52 GB; the plan's tensors alone:
    80 layers x (612,368,384 Q4_K weights) x 144/256 = 27,556,577,280
    + 40 x down 234,881,024 x 144/256 + embedding 1,050,673,152 x 144/256 (Q4_K)
    + 40 x v 8,388,608 x 176/256 (Q5_K) + 40 x (v + down) + LM head, x 210/256 (Q6_K)
    + 161 norms x 8192 x 4 = 42,512,531,456 bytes (the file adds rope_freqs and metadata)."""
    total = plan_bytes("q4_k_m", llama_70b_tensors(), LLAMA_70B)
    assert total == nbytes(weights_by_type("q4_k_m", llama_70b_tensors(), LLAMA_70B))
    assert total == 42_512_531_456
    assert abs(total - 42.52e9) / 42.52e9 < 0.001


@pytest.mark.parametrize("file_type, norm_type", [("q8_0", "F32"), ("int8", "BF16")])
def test_llama_70b_q8_0_and_int8(file_type: str, norm_type: str) -> None:
    """Every 2-D weight Q8_0 (34 bytes per 32); norms F32 in a GGUF, the float type in int8."""
    model = PlanModel("llama", 80, 64, 8, float_type=Q.BF16)
    linears = 80 * (L70_Q + 2 * L70_KV + L70_O + 3 * L70_MLP) + 2 * L70_VOCAB
    counts = weights_by_type(file_type, llama_70b_tensors(), model)
    assert counts == {"Q8_0": linears, norm_type: L70_NORMS}
    expected = linears // 32 * 34 + L70_NORMS * BLOCKS[norm_type][1]
    assert plan_bytes(file_type, llama_70b_tensors(), model) == expected


# Weights of each role of Qwen3-30B-A3B, per layer unless named otherwise.
QW_Q = QW_O = 4096 * 2048
QW_KV = 512 * 2048  # k or v
QW_EXPERT = 768 * 2048  # one expert's gate, up or down
QW_ROUTER = 128 * 2048
QW_VOCAB = 151936 * 2048
QW_NORMS = 48 * (2 * 2048 + 2 * 128) + 2048  # layer norms, q/k norms, final norm


def test_qwen3_moe_q4_k_m_types_by_hand() -> None:
    """As the 70B, with the experts' down_proj as ffn_down in the 24 more-bits layers, no
    70B rule (v is Q4_K elsewhere), 128 experts (not 8: no Mixtral rule) and the router F32."""
    assert weights_by_type("q4_k_m", qwen3_moe_tensors(), QWEN3_MOE) == {
        "Q4_K": 48 * (QW_Q + QW_KV + QW_O + 128 * 2 * QW_EXPERT)
        + 24 * (QW_KV + 128 * QW_EXPERT)
        + QW_VOCAB,
        "Q6_K": 24 * (QW_KV + 128 * QW_EXPERT) + QW_VOCAB,
        "F32": 48 * QW_ROUTER + QW_NORMS,
    }
    assert plan_bytes("q4_k_m", qwen3_moe_tensors(), QWEN3_MOE) == 18_550_716_416


@pytest.mark.parametrize("file_type, float_type", [("q8_0", "F32"), ("int8", "BF16")])
def test_qwen3_moe_q8_0_and_int8(file_type: str, float_type: str) -> None:
    """Q8_0 for every linear and the vocab matrices; the router stays float in both."""
    model = PlanModel("qwen3_moe", 48, 32, 4, num_experts=128, float_type=Q.BF16)
    linears = 48 * (QW_Q + 2 * QW_KV + QW_O + 128 * 3 * QW_EXPERT) + 2 * QW_VOCAB
    counts = weights_by_type(file_type, qwen3_moe_tensors(), model)
    assert counts == {"Q8_0": linears, float_type: 48 * QW_ROUTER + QW_NORMS}
    assert plan_bytes(file_type, qwen3_moe_tensors(), model) == nbytes(counts)


def test_tied_embedding_takes_the_lm_head_type() -> None:
    tied = PlanModel("llama", 32, 32, 8, tied_embeddings=True)
    assert tensor_type("q4_k_m", "model.embed_tokens.weight", (128256, 4096), tied) == Q.Q6_K
    untied = PlanModel("llama", 32, 32, 8)
    assert tensor_type("q4_k_m", "model.embed_tokens.weight", (128256, 4096), untied) == Q.Q4_K


def test_fallbacks_when_rows_are_not_whole_blocks() -> None:
    """A 576-wide row (SmolLM2-135M) is 2.25 blocks of 256: Q4_K -> Q5_0, Q6_K -> Q8_0, the
    LM head Q8_0; a 48-wide row is not even whole 32-blocks: F16, or the float type in int8."""
    model = PlanModel("llama", 30, 9, 3, float_type=Q.BF16)
    assert tensor_type("q4_k_m", "model.layers.5.self_attn.q_proj.weight", (576, 576), model) == (
        Q.Q5_0
    )
    assert tensor_type("q4_k_m", "model.layers.0.mlp.down_proj.weight", (576, 1536), model) == (
        Q.Q6_K
    )  # 1536 is 6 blocks
    assert tensor_type("q4_k_m", "model.layers.0.self_attn.v_proj.weight", (192, 576), model) == (
        Q.Q8_0
    )
    assert tensor_type("q4_k_m", "lm_head.weight", (49152, 576), model) == Q.Q8_0
    assert tensor_type("q8_0", "model.layers.0.mlp.up_proj.weight", (64, 48), model) == Q.F16
    assert tensor_type("int8", "model.layers.0.mlp.up_proj.weight", (64, 48), model) == Q.BF16


def test_eight_expert_rules() -> None:
    """llama.cpp's Mixtral rules: attn_v and attn_k Q8_0, attn_output Q5_K."""
    model = PlanModel("mixtral", 32, 32, 8, num_experts=8)
    shape = (1024, 4096)
    assert tensor_type("q4_k_m", "model.layers.3.self_attn.v_proj.weight", shape, model) == Q.Q8_0
    assert tensor_type("q4_k_m", "model.layers.3.self_attn.k_proj.weight", shape, model) == Q.Q8_0
    assert tensor_type("q4_k_m", "model.layers.3.self_attn.o_proj.weight", shape, model) == Q.Q5_K
    assert tensor_type("q4_k_m", "model.layers.3.self_attn.q_proj.weight", shape, model) == Q.Q4_K


def test_biases_and_norms_stay_float() -> None:
    model = PlanModel("qwen2", 28, 12, 2, float_type=Q.F16)
    assert tensor_type("q4_k_m", "model.layers.0.self_attn.q_proj.bias", (1536,), model) == Q.F32
    assert tensor_type("int8", "model.layers.0.self_attn.q_proj.bias", (1536,), model) == Q.F16
    assert tensor_type("q8_0", "model.norm.weight", (1536,), model) == Q.F32


def test_unknown_file_type_names_the_choices() -> None:
    with pytest.raises(ValueError, match="'q4_0' is not one of q4_k_m, q8_0, int8"):
        tensor_type("q4_0", "lm_head.weight", (10, 32), LLAMA_70B)


def test_tensor_bytes_is_blocks_times_type_size() -> None:
    assert tensor_bytes(Q.Q4_K, (3, 512)) == 3 * 2 * 144
    assert tensor_bytes(Q.Q8_0, (2, 64)) == 2 * 2 * 34
    assert tensor_bytes(Q.BF16, (5,)) == 10


@pytest.mark.parametrize(
    "file_type, up, down", [("q4_k_m", Q.Q4_K, Q.Q6_K), ("q8_0", Q.Q8_0, Q.Q8_0)]
)
def test_starcoder2_mlp_is_llama_cpp_ffn_up_and_down(file_type: str, up: Q, down: Q) -> None:
    """StarCoder 2's gateless MLP (c_fc, c_proj) quantizes as llama.cpp's ffn_up and
    ffn_down: layer 0's down gets more bits under Q4_K_M; in int8 both are Q8_0."""
    model = PlanModel("starcoder2", num_layers=30, num_heads=24, num_kv_heads=2)
    mlp = "model.layers.0.mlp"
    assert tensor_type(file_type, f"{mlp}.c_fc.weight", (12288, 3072), model) == up
    assert tensor_type(file_type, f"{mlp}.c_proj.weight", (3072, 12288), model) == down
    assert tensor_type("int8", f"{mlp}.c_proj.weight", (3072, 12288), model) == Q.Q8_0
