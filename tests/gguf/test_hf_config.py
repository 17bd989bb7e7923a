"""pagedllm/gguf/hf_config.py against transformers' own GGUF config of the default model
(SmolLM2-135M-Instruct Q4_1), and against tiny HF models written to GGUF with llama.cpp's
conventions; rope scaling as llama.cpp's converter writes it and as its loader reads it."""

import math

import gguf
import numpy as np
import pytest
import torch
from gguf import GGUFValueType as VT
from transformers import AutoConfig
from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from pagedllm.config import ModelConfig
from pagedllm.gguf.hf_config import load_gguf_config
from pagedllm.gguf.tensor_names import iterate_gguf_weights
from pagedllm.layers.attention_backends.selector import use_attn_backend
from pagedllm.layers.rotary_embedding import get_rope
from pagedllm.model_loader.loader import get_model
from tests.gguf.test_gguf_olmo2 import PROMPT, Q8_0_ATOL
from tests.gguf.test_gguf_phi3 import logits_match_transformers
from tests.gguf.tiny_gguf import (
    GEMMAS,
    TINY,
    gguf_tensors,
    set_metadata,
    tiny_model,
    write_gguf,
    write_tiny,
    write_tiny_q8_0,
)
from tests.models.test_models_vs_transformers import paged_greedy

CONFIG_FIELDS = [
    "architectures",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "rms_norm_eps",
    "rope_parameters",
    "max_position_embeddings",
    "vocab_size",
    "tie_word_embeddings",
    "bos_token_id",
    "eos_token_id",
]
GEMMA2_FIELDS = [
    "query_pre_attn_scalar",
    "sliding_window",
    "layer_types",
    "attn_logit_softcapping",
    "final_logit_softcapping",
]
HF_CLASSES = {
    "gemma": "GemmaForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
    "granite": "GraniteForCausalLM",
    "llama": "LlamaForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3moe": "Qwen3MoeForCausalLM",
    "smollm3": "SmolLM3ForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "olmo2": "Olmo2ForCausalLM",
    "olmo3": "Olmo3ForCausalLM",
    "glm4": "Glm4ForCausalLM",
    "starcoder2": "Starcoder2ForCausalLM",
    "ernie4_5": "Ernie4_5ForCausalLM",
    "exaone4": "Exaone4ForCausalLM",
    "qwen2moe": "Qwen2MoeForCausalLM",
    "olmoe": "OlmoeForCausalLM",
    "granitemoe": "GraniteMoeForCausalLM",
}


def test_config_matches_transformers_gguf_config(gguf_path: str) -> None:
    """Reference: the config dict of transformers' GGUF load (`load_gguf_checkpoint`, what
    `from_pretrained(folder, gguf_file=...)` runs)."""
    expected = AutoConfig.for_model(**load_gguf_checkpoint(gguf_path)["config"])
    config = load_gguf_config(gguf_path)
    assert config.architectures == ["LlamaForCausalLM"]
    for field in CONFIG_FIELDS[1:]:
        assert getattr(config, field) == getattr(expected, field), field
    assert config.pad_token_id == expected.pad_token_id


@pytest.mark.parametrize("arch", list(TINY))
def test_tiny_round_trip_config(arch: str, tiny_files: dict) -> None:
    path, expected, _ = tiny_files[arch]
    config = load_gguf_config(path)
    assert config.model_type == expected.model_type
    assert config.architectures == [HF_CLASSES[arch]]
    for field in CONFIG_FIELDS[1:]:
        if field == "rms_norm_eps":  # stored as float32; StarCoder 2's LayerNorms' own field
            eps = "norm_epsilon" if arch == "starcoder2" else field
            assert getattr(config, eps) == pytest.approx(getattr(expected, eps), rel=1e-6)
        elif field == "rope_parameters" and arch == "phi3":
            check_longrope(config, expected)
        else:
            assert getattr(config, field) == getattr(expected, field), field
    if arch in ("granite", "granitemoe"):  # stored as float32
        for field in ("embedding_multiplier", "residual_multiplier", "attention_multiplier"):
            assert getattr(config, field) == pytest.approx(getattr(expected, field), rel=1e-6)
        assert config.logits_scaling == expected.logits_scaling
    if arch == "qwen3moe":
        for field in ("num_experts", "num_experts_per_tok", "moe_intermediate_size"):
            assert getattr(config, field) == getattr(expected, field), field
        assert config.norm_topk_prob
    if arch == "mixtral":
        for field in ("num_local_experts", "num_experts_per_tok", "sliding_window"):
            assert getattr(config, field) == getattr(expected, field), field
    if arch in GEMMAS:
        assert config.hidden_activation == "gelu_pytorch_tanh"
    if arch == "smollm3":  # llama.cpp's NoPE layers (every 4th), no window
        assert config.no_rope_layers == expected.no_rope_layers == [1, 1, 1, 0]
        assert not config.use_sliding_window
    if arch in ("gemma2", "gemma3"):
        for field in GEMMA2_FIELDS:
            assert getattr(config, field) == getattr(expected, field), field


def check_longrope(config, expected) -> None:
    """Phi-3: the factors and lengths exactly, and the cos/sin scale the converter wrote
    (float32) as transformers computes it from the lengths."""
    rope = dict(config.rope_parameters)
    _, scale = ROPE_INIT_FUNCTIONS["longrope"](expected, "cpu")
    assert rope.pop("attention_factor") == pytest.approx(scale, rel=1e-6)
    assert rope == expected.rope_parameters
    for field in ("original_max_position_embeddings", "sliding_window"):
        assert getattr(config, field) == getattr(expected, field), field


@pytest.mark.parametrize("arch", ["olmo2", "olmo3", "glm4", "starcoder2", "ernie4_5", "exaone4"])
def test_q8_0_file_runs_as_its_weights(arch: str, tmp_path) -> None:
    """Every weight in Q8_0 blocks (write_tiny_q8_0), run natively against transformers on
    the same rounded weights: near, not equal, as the kernels quantize activations too."""
    path = str(tmp_path / "q8.gguf")
    model = write_tiny_q8_0(path, arch)
    logits_match_transformers(path, model, PROMPT, 256, atol=Q8_0_ATOL)


@pytest.mark.parametrize("arch", list(TINY))
def test_tiny_logits_match_transformers(arch: str, tiny_files: dict) -> None:
    """Reference: transformers' model of the weights the file was written from (tiny_model is
    seeded), fp32 logits of a paged prefill and 8 decode steps within 1e-4, past the Gemmas'
    and Phi-3's windows and Phi-3's original length (its long LongRoPE factors). Attention
    is the torch reference (TORCH_SDPA), which applies windows and soft caps whichever
    kernels do: this tests what the file maps to, not the kernels."""
    path, _, _ = tiny_files[arch]
    with use_attn_backend("TORCH_SDPA"):
        ours = get_model(ModelConfig.create(path, dtype="float32"))
    prompt = [5, 17, 60, 3, 33, 42, 7, 12, 9, 50]
    (tokens,), (logits,) = paged_greedy(ours, [prompt])
    with torch.no_grad():
        reference = tiny_model(arch).eval()(torch.tensor([tokens[:-1]])).logits[0]
    assert reference.std() > 100 * 1e-4, "reference logits too flat to test anything"
    torch.testing.assert_close(logits, reference, atol=1e-4, rtol=0)


def write_model(path: str, arch: str, model, rope: dict | None = None, **tensors) -> None:
    """The model as a GGUF file, with `rope` scaling metadata and the extra `tensors`."""
    stored = gguf_tensors(arch, model.config, model.state_dict())
    write_gguf(path, arch, model.config, stored | tensors, rope)


def test_yarn_rope_scaling_from_metadata(tmp_path) -> None:
    path = str(tmp_path / "yarn.gguf")
    rope = {"type": gguf.RopeScalingType.YARN, "factor": 4.0, "original": 64}
    write_model(path, "qwen3", tiny_model("qwen3"), rope)
    assert load_gguf_config(path).rope_parameters == {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 64,
    }


def test_yarn_attn_factor_scales_cos_sin_as_llama_cpp_does(tmp_path) -> None:
    """References: llama.cpp's arithmetic (llama_context: yarn_attn_factor = get_mscale(f)
    / (0.1 ln f + 1) * attn_factor; ggml's rope_yarn multiplies cos/sin by it times
    0.1 ln f + 1) for the magnitude, and transformers' YaRN with that `attention_factor`
    for the whole cos/sin cache."""
    path = str(tmp_path / "yarn_attn.gguf")
    rope = {"type": gguf.RopeScalingType.YARN, "factor": 4.0, "original": 64}
    model = tiny_model("qwen3")
    stored = gguf_tensors("qwen3", model.config, model.state_dict())
    attn_factor = {"qwen3.rope.scaling.attn_factor": (0.75, VT.FLOAT32)}
    write_gguf(path, "qwen3", model.config, stored, rope, set_metadata(attn_factor))
    config = load_gguf_config(path)
    get_mscale = 0.1 * math.log(4.0) + 1.0
    magnitude = get_mscale / (0.1 * math.log(4.0) + 1.0) * 0.75 * (0.1 * math.log(4.0) + 1.0)
    expected = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0}
    expected |= {"original_max_position_embeddings": 64, "attention_factor": magnitude}
    assert config.rope_parameters == pytest.approx(expected)
    head_dim, positions = config.head_dim, config.max_position_embeddings
    rope = get_rope(head_dim, head_dim, positions, 10000.0, config.rope_parameters)
    hf_config = tiny_model("qwen3", rope_parameters=dict(expected)).config
    inv_freq, scale = ROPE_INIT_FUNCTIONS["yarn"](hf_config, "cpu")
    angles = torch.arange(positions, dtype=torch.float32)[:, None] * inv_freq
    reference = torch.cat((angles.cos() * scale, angles.sin() * scale), dim=-1)
    torch.testing.assert_close(rope.cos_sin_cache[:positions], reference, rtol=0, atol=1e-6)


def test_attn_factor_beside_other_rope_is_refused(tmp_path) -> None:
    """llama.cpp scales any rope's cos/sin by attn_factor; pagedllm does on YaRN only."""
    metadata = {
        "llama.rope.scaling.factor": (2.0, VT.FLOAT32),
        "llama.rope.scaling.attn_factor": (1.5, VT.FLOAT32),
    }
    path = write_tiny(str(tmp_path / "linear_attn.gguf"), **metadata)
    with pytest.raises(ValueError, match="attn_factor 1.5 .* 'linear' rope; .* yarn only"):
        load_gguf_config(path)
    metadata["llama.rope.scaling.attn_factor"] = (1.0, VT.FLOAT32)
    path = write_tiny(str(tmp_path / "linear_attn_1.gguf"), **metadata)
    assert "attention_factor" not in load_gguf_config(path).rope_parameters


def llama3_rope_freqs(head_dim: int, theta: float, factor: float) -> np.ndarray:
    """convert_hf_to_gguf.py LlamaModel.generate_extra_tensors for Llama 3 (low 1, high 4,
    original context 8192)."""
    freqs = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < 8192 / 4:
            factors.append(1)
        elif wavelen > 8192 / 1:
            factors.append(factor)
        else:
            smooth = (8192 / wavelen - 1) / (4 - 1)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


@pytest.mark.parametrize("factor", [8.0, 32.0])
def test_llama3_rope_scaling_from_rope_freqs(tmp_path, factor: float) -> None:
    rope = {"rope_type": "default", "rope_theta": 500000.0}
    model = tiny_model("llama", head_dim=128, rope_parameters=rope)
    path = str(tmp_path / "llama3.gguf")
    rope_freqs = llama3_rope_freqs(128, 500000.0, factor)
    write_model(path, "llama", model, **{"rope_freqs.weight": rope_freqs})
    assert load_gguf_config(path).rope_parameters == {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": factor,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    assert "rope_freqs.weight" not in dict(iterate_gguf_weights(path, torch.float32))


def test_unknown_rope_freqs_raise(tmp_path) -> None:
    model = tiny_model("llama")
    path = str(tmp_path / "odd_rope.gguf")
    rope_freqs = np.full(model.config.head_dim // 2, 2.0, np.float32)
    write_model(path, "llama", model, **{"rope_freqs.weight": rope_freqs})
    with pytest.raises(ValueError, match="rope_freqs"):
        load_gguf_config(path)


def test_unsupported_architecture_names_it(tmp_path) -> None:
    path = str(tmp_path / "gpt2.gguf")
    writer = gguf.GGUFWriter(path, "gpt2")
    writer.add_block_count(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match=r"'gpt2' is not supported.*'llama'.*'qwen3moe'"):
        load_gguf_config(path)


ROPE_KEYS = [
    # llama.cpp (llama_model::load_hparams): the type defaults to linear
    ({"llama.rope.scaling.factor": (4.0, VT.FLOAT32)}, {"rope_type": "linear", "factor": 4.0}),
    # the factor's older key, read where rope.scaling.factor is absent
    ({"llama.rope.scale_linear": (4.0, VT.FLOAT32)}, {"rope_type": "linear", "factor": 4.0}),
    # a factor of 0, or none, is no scaling whatever the type
    ({"llama.rope.scaling.type": ("linear", VT.STRING)}, {"rope_type": "default"}),
    (
        {
            "llama.rope.scaling.type": ("linear", VT.STRING),
            "llama.rope.scaling.factor": (0.0, VT.FLOAT32),
            "llama.rope.scale_linear": (4.0, VT.FLOAT32),
        },
        {"rope_type": "default"},
    ),
    (
        {
            "llama.rope.scaling.type": ("none", VT.STRING),
            "llama.rope.scaling.factor": (4.0, VT.FLOAT32),
        },
        {"rope_type": "default"},
    ),
]


@pytest.mark.parametrize(("metadata", "expected"), ROPE_KEYS)
def test_rope_scaling_keys_read_as_llama_cpp_reads_them(
    tmp_path, metadata: dict, expected: dict
) -> None:
    path = write_tiny(str(tmp_path / "rope.gguf"), **metadata)
    assert load_gguf_config(path).rope_parameters == {"rope_theta": 10000.0, **expected}


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("llama.attention.head_count_kv", 3, "head_count 4 is not a multiple of .*head_count_kv 3"),
        ("qwen3moe.expert_used_count", 5, "expert_used_count 5 exceeds qwen3moe.expert_count 4"),
    ],
)
def test_inconsistent_head_or_expert_counts_name_both(
    tmp_path, key: str, value: int, message: str
) -> None:
    path = write_tiny(
        str(tmp_path / "bad.gguf"), key.partition(".")[0], **{key: (value, VT.UINT32)}
    )
    with pytest.raises(ValueError, match=f"bad.gguf: .*{message}"):
        load_gguf_config(path)


def test_llama_ffn_biases_load_as_mlp_bias(tmp_path, tiny_files: dict) -> None:
    """llama.cpp loads blk.N.ffn_{gate,up,down}.bias of llama where present; the config says
    mlp_bias, and the logits are transformers' on the same weights (fp32, 1e-4)."""
    model = tiny_model("llama", mlp_bias=True).eval()
    path = str(tmp_path / "mlp_bias.gguf")
    write_model(path, "llama", model)
    assert load_gguf_config(path).mlp_bias
    assert not load_gguf_config(tiny_files["llama"][0]).mlp_bias
    ours = get_model(ModelConfig.create(path, dtype="float32"))
    prompt = [5, 17, 60, 3, 33, 42, 7, 12]
    _, (logits,) = paged_greedy(ours, [prompt])
    with torch.no_grad():
        reference = model(torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(logits[: len(prompt)], reference, atol=1e-4, rtol=0)
