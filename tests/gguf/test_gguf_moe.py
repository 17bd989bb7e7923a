"""pagedllm/gguf/moe.py: llama.cpp's `qwen2moe`, `olmoe` and `granitemoe` files as
convert_hf_to_gguf.py writes them (experts stacked, Qwen2-MoE's shared expert and its gate
squeezed to [hidden], Granite MoE's q/k rows permuted), read back as the config and the
checkpoint tensors of the transformers model they were written from, and run against it
(fp32, TORCH_SDPA, 1e-4); Q8_0 experts run natively as they run dequantized; what cannot be
mapped refused by name. The plain files' logits: test_hf_config.py's tiny logits test.
"""

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as VT
from gguf.quants import quantize

from pagedllm import LLM, SamplingParams, _cpu_kernels
from pagedllm.config import ModelConfig
from pagedllm.gguf.hf_config import load_gguf_config
from pagedllm.gguf.reader import read_gguf
from pagedllm.gguf.tensor_names import iterate_gguf_weights
from pagedllm.layers.quantization.gguf import GGUFFusedMoEMethod
from pagedllm.model_loader.loader import build_model
from tests.gguf.test_gguf_phi3 import logits_match_transformers
from tests.gguf.tiny_gguf import (
    MOE_FAMILIES,
    gguf_tensors,
    set_metadata,
    tiny_model,
    write_gguf,
    write_tiny,
)

PROMPT = [5, 17, 60, 3, 33, 42, 7, 12, 9, 50]
MOE_FIELDS = {
    "qwen2moe": (
        "num_experts",
        "num_experts_per_tok",
        "moe_intermediate_size",
        "shared_expert_intermediate_size",
        "norm_topk_prob",
        "decoder_sparse_step",
        "mlp_only_layers",
        "qkv_bias",
    ),
    "olmoe": ("num_experts", "num_experts_per_tok", "intermediate_size", "norm_topk_prob"),
    "granitemoe": ("num_local_experts", "num_experts_per_tok", "intermediate_size"),
}
GRANITE_SCALES = ("embedding_multiplier", "residual_multiplier", "attention_multiplier")


def test_the_files_are_written_as_llama_cpp_writes_them(tiny_files: dict) -> None:
    for arch in MOE_FAMILIES:
        gguf = read_gguf(tiny_files[arch][0])
        assert gguf.metadata["general.architecture"] == arch
        assert gguf.metadata[f"{arch}.expert_count"] == 4
        assert gguf.tensors["blk.1.ffn_gate_inp.weight"].shape == (4, 32)
    tensors = read_gguf(tiny_files["qwen2moe"][0]).tensors
    assert tensors["blk.1.ffn_up_exps.weight"].shape == (4, 16, 32)
    assert tensors["blk.1.ffn_gate_inp_shexp.weight"].shape == (32,)
    assert tensors["blk.1.ffn_down_shexp.weight"].shape == (32, 24)
    assert read_gguf(tiny_files["olmoe"][0]).tensors["blk.0.attn_k_norm.weight"].shape == (16,)


@pytest.mark.parametrize("arch", MOE_FAMILIES)
def test_config_fields_are_the_model_s(arch: str, tiny_files: dict) -> None:
    path, expected, _ = tiny_files[arch]
    config = load_gguf_config(path)
    for field in MOE_FIELDS[arch]:
        assert getattr(config, field) == getattr(expected, field), field
    if arch == "granitemoe":  # stored as float32
        for field in GRANITE_SCALES:
            assert getattr(config, field) == pytest.approx(getattr(expected, field), rel=1e-6)
        assert config.logits_scaling == expected.logits_scaling
    if arch == "olmoe":
        assert config.clip_qkv is None


@pytest.mark.parametrize("arch", MOE_FAMILIES)
def test_tensors_are_the_checkpoint_s(arch: str, tiny_files: dict) -> None:
    """Under the names pagedllm's model takes, experts one by one, Granite MoE's q/k rows
    unpermuted and Qwen2-MoE's shared gate [1, hidden] again."""
    path, _, expected = tiny_files[arch]
    loaded = dict(iterate_gguf_weights(path, torch.float32))
    assert loaded.keys() == expected.keys()
    for name, tensor in loaded.items():
        assert torch.equal(tensor, expected[name]), name


def test_qwen2moe_sizes_default_as_llama_cpp_defaults_them(tmp_path) -> None:
    """No expert sizes in the file: routed experts of feed_forward_length / expert_used_count,
    a shared one of feed_forward_length; a shared gate written unsqueezed, [1, hidden]."""
    model = tiny_model("qwen2moe", moe_intermediate_size=24, shared_expert_intermediate_size=48)
    stored = gguf_tensors("qwen2moe", model.config, model.state_dict())
    stored["blk.0.ffn_gate_inp_shexp.weight"] = stored["blk.0.ffn_gate_inp_shexp.weight"][None]
    path = str(tmp_path / "defaults.gguf")
    sizes = ("expert_feed_forward_length", "expert_shared_feed_forward_length")
    edit = set_metadata({f"qwen2moe.{key}": () for key in sizes})
    write_gguf(path, "qwen2moe", model.config, stored, edit=edit)
    config = load_gguf_config(path)
    assert (config.moe_intermediate_size, config.shared_expert_intermediate_size) == (24, 48)
    logits_match_transformers(path, model, PROMPT, max_model_len=256)


def test_granitemoe_with_tied_embeddings(tmp_path) -> None:
    model = tiny_model("granitemoe", tie_word_embeddings=True)
    path = str(tmp_path / "tied.gguf")
    stored = gguf_tensors("granitemoe", model.config, model.state_dict())
    assert "output.weight" not in stored
    write_gguf(path, "granitemoe", model.config, stored)
    logits_match_transformers(path, model, PROMPT, max_model_len=256)


def write_q8_0_experts(path: str, arch: str) -> None:
    """A tiny `arch` model whose experts (and shared expert) are Q8_0, rows whole 32-blocks."""
    sizes = dict(hidden_size=64, intermediate_size=64, head_dim=16)
    if arch == "qwen2moe":
        sizes |= dict(moe_intermediate_size=32, shared_expert_intermediate_size=64)
    if arch == "granitemoe":  # logits multiplied rather than divided by 8: not too flat
        sizes |= dict(logits_scaling=0.125)
    model = tiny_model(arch, **sizes)
    stored = {}
    for name, array in gguf_tensors(arch, model.config, model.state_dict()).items():
        expert = ("_exps." in name or "_shexp." in name) and array.ndim >= 2
        stored[name] = (quantize(array, Q.Q8_0), Q.Q8_0) if expert else (array, Q.F32)
    write_gguf(path, arch, model.config, stored)


def prompt_logprobs(path: str, quantization: str | None) -> torch.Tensor:
    engine = dict(skip_tokenizer_init=True, num_kv_blocks=32, max_logprobs=64, dtype="float32")
    params = SamplingParams(max_tokens=1, prompt_logprobs=64, temperature=0)
    with LLM(path, quantization=quantization, **engine) as llm:
        (output,) = llm.generate({"prompt_token_ids": PROMPT}, params, use_tqdm=False)
    return torch.tensor([[row[t].logprob for t in range(64)] for row in output.prompt_logprobs[1:]])


@pytest.mark.parametrize("arch", MOE_FAMILIES)
def test_q8_0_experts_run_natively_as_dequantized(
    arch: str, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The torch reference ops (pagedllm._C off) on the Q8_0 blocks, against the same file
    dequantized at load."""
    path = str(tmp_path / f"{arch}.gguf")
    write_q8_0_experts(path, arch)
    model = build_model(ModelConfig.create(path, "float32"), "meta")
    assert isinstance(model.model.layers[1].mlp.experts.quant_method, GGUFFusedMoEMethod)
    monkeypatch.setattr(_cpu_kernels, "_C", None)
    reference = prompt_logprobs(path, "none")
    assert reference.std() > 0.1, "reference logprobs too flat to test anything"
    torch.testing.assert_close(prompt_logprobs(path, None), reference, atol=1e-4, rtol=0)


REFUSED_METADATA = [
    ("qwen2moe", {"qwen2moe.expert_count": ()}, "no metadata key 'qwen2moe.expert_count'"),
    ("qwen2moe", {"qwen2moe.feed_forward_length": ()}, "no metadata key .*feed_forward_length"),
    ("olmoe", {"olmoe.expert_used_count": ()}, "no metadata key 'olmoe.expert_used_count'"),
    ("olmoe", {"olmoe.expert_used_count": (5, VT.UINT32)}, "expert_used_count 5 exceeds .* 4"),
    ("granitemoe", {"granitemoe.logit_scale": ()}, "no metadata key 'granitemoe.logit_scale'"),
    (
        "granitemoe",
        {"granitemoe.expert_shared_feed_forward_length": (16, VT.UINT32)},
        "shared expert \\(Granite MoE Shared\\)",
    ),
]


@pytest.mark.parametrize(("arch", "metadata", "message"), REFUSED_METADATA)
def test_unmappable_metadata_is_refused(tmp_path, arch: str, metadata: dict, message: str) -> None:
    path = write_tiny(str(tmp_path / "bad.gguf"), arch, **metadata)
    with pytest.raises(ValueError, match=f"bad.gguf.*{message}"):
        load_gguf_config(path)


REFUSED_TENSORS = [
    ("qwen2moe", "blk.1.ffn_gate_inp_shexp.weight", None, "no tensor blk.1.ffn_gate_inp_shexp"),
    ("olmoe", "blk.0.ffn_down_exps.weight", None, "no tensor blk.0.ffn_down_exps.weight"),
    ("qwen2moe", "blk.0.ffn_up_shexp.weight", (20, 32), r"ffn_up_shexp.weight .*\[24, 32\]"),
    ("olmoe", "blk.0.attn_q_norm.weight", (8,), r"attn_q_norm.weight has shape \[8\].*\[32\]"),
]


@pytest.mark.parametrize(("arch", "name", "shape", "message"), REFUSED_TENSORS)
def test_missing_or_misshapen_tensors_are_refused(
    tmp_path, arch: str, name: str, shape: tuple | None, message: str
) -> None:
    model = tiny_model(arch)
    stored = gguf_tensors(arch, model.config, model.state_dict())
    del stored[name]
    if shape is not None:
        stored[name] = np.zeros(shape, np.float32)
    path = str(tmp_path / "bad.gguf")
    write_gguf(path, arch, model.config, stored)
    with pytest.raises(ValueError, match=f"bad.gguf.*{message}"):
        load_gguf_config(path)
