"""pagedllm/gguf/phi3.py: Phi-3 files as convert_hf_to_gguf.py's Phi3MiniModel writes them,
run against transformers on the same weights (fp32, TORCH_SDPA, 1e-4): LongRoPE's short
factors within the original length, Phi-4's plain rope without a window; LongRoPE's cos/sin
scale as llama.cpp applies it (rope.scaling.attn_factor, 1 where absent); what cannot be
mapped refused by name. The long factors past the original length: test_hf_config.py's
tiny logits test.

(Not test_phi3.py: tests/models has one, and test basenames must be unique.)"""

import numpy as np
import pytest
import torch
from gguf import GGUFValueType as VT

from pagedllm.config import ModelConfig
from pagedllm.gguf.hf_config import load_gguf_config
from pagedllm.layers.attention_backends.selector import use_attn_backend
from pagedllm.layers.rotary_embedding import get_rope, use_max_model_len
from pagedllm.model_loader.loader import get_model
from pagedllm.models.config_fields import rope_parameters, rotary_dim
from tests.gguf.tiny_gguf import gguf_tensors, set_metadata, tiny_model, write_gguf, write_tiny
from tests.models.test_models_vs_transformers import paged_greedy

PHI4_ROPE = {"rope_type": "default", "rope_theta": 250000.0, "partial_rotary_factor": 1.0}


def logits_match_transformers(
    path: str, model, prompt: list[int], max_model_len: int, atol: float = 1e-4
) -> None:
    with use_attn_backend("TORCH_SDPA"):
        config = ModelConfig.create(path, dtype="float32", max_model_len=max_model_len)
        ours = get_model(config)
    (tokens,), (logits,) = paged_greedy(ours, [prompt])
    with torch.no_grad():
        reference = model.eval()(torch.tensor([tokens[:-1]])).logits[0]
    assert reference.std() > 100 * 1e-4, "reference logits too flat to test anything"
    torch.testing.assert_close(logits, reference, atol=atol, rtol=0)


def test_short_factors_within_the_original_length(tiny_files: dict) -> None:
    """max_model_len 16, the original length: the short factors, as transformers rotates a
    sequence of up to 16 tokens (here 4 + 8 generated)."""
    path, _, _ = tiny_files["phi3"]
    logits_match_transformers(path, tiny_model("phi3"), [5, 17, 60, 3], max_model_len=16)


def test_phi4_without_factors_or_window(tmp_path) -> None:
    """Phi-4: no LongRoPE factors and attention.sliding_window 0, so plain rope over whole
    heads and no window."""
    model = tiny_model("phi3", rope_parameters=PHI4_ROPE, sliding_window=None)
    path = str(tmp_path / "phi4.gguf")
    stored = gguf_tensors("phi3", model.config, model.state_dict())
    assert not [name for name in stored if name.startswith("rope_factors")]
    write_gguf(path, "phi3", model.config, stored)
    config = load_gguf_config(path)
    assert config.rope_parameters == PHI4_ROPE
    assert config.sliding_window is None
    logits_match_transformers(path, model, [5, 17, 60, 3, 33, 42, 7, 12, 9, 50], 256)


@pytest.mark.parametrize(("attn_factor", "scale"), [((1.25, VT.FLOAT32), 1.25), ((), 1.0)])
def test_longrope_cos_sin_scale_is_attn_factor(tmp_path, attn_factor: tuple, scale: float) -> None:
    """llama.cpp multiplies cos and sin by rope.scaling.attn_factor (1 where absent), long
    factors or short, whatever the lengths say; position 0 shows it: cos = scale, sin = 0."""
    metadata = {"phi3.rope.scaling.attn_factor": attn_factor}
    config = load_gguf_config(write_tiny(str(tmp_path / "attn.gguf"), "phi3", **metadata))
    assert config.rope_parameters["attention_factor"] == scale
    theta, params = rope_parameters(config)
    rotary = rotary_dim(config, config.head_dim)
    for max_model_len in (16, 256):  # short factors, long ones
        with use_max_model_len(max_model_len):
            rope = get_rope(config.head_dim, rotary, 256, theta, params)
        expected = torch.tensor([scale] * (rotary // 2) + [0.0] * (rotary // 2))
        torch.testing.assert_close(rope.cos_sin_cache[0], expected, rtol=0, atol=0)


def test_fused_tensors_come_as_the_checkpoint_holds_them(tiny_files: dict) -> None:
    """attn_qkv and ffn_up are the checkpoint's qkv_proj and gate_up_proj, rows unpermuted."""
    path, _, expected = tiny_files["phi3"]
    assert "model.layers.0.self_attn.qkv_proj.weight" in expected
    assert "model.layers.0.mlp.gate_up_proj.weight" in expected
    assert not [name for name in expected if "rope" in name]


REFUSED = [
    ({"phi3.rope.scaling.factor": (4.0, VT.FLOAT32)}, r"rope.scaling.factor 4.0 scales"),
    ({"phi3.rope.dimension_count": (13, VT.UINT32)}, r"dimension_count 13 must be even"),
    ({"phi3.rope.dimension_count": (18, VT.UINT32)}, r"at most head_dim 16"),
]


@pytest.mark.parametrize(("metadata", "message"), REFUSED)
def test_unmappable_metadata_is_refused(tmp_path, metadata: dict, message: str) -> None:
    path = write_tiny(str(tmp_path / "bad.gguf"), "phi3", **metadata)
    with pytest.raises(ValueError, match=f"bad.gguf: .*{message}"):
        load_gguf_config(path)


def write_with(tmp_path, drop: tuple[str, ...] = (), rope=None, **tensors) -> str:
    """The tiny Phi-3 file without the tensors `drop`, with `tensors` added."""
    model = tiny_model("phi3", **({"rope_parameters": rope} if rope else {}))
    stored = gguf_tensors("phi3", model.config, model.state_dict())
    stored = {name: t for name, t in stored.items() if name not in drop} | tensors
    path = str(tmp_path / "bad.gguf")
    attn = {"phi3.rope.scaling.attn_factor": (1.5, VT.FLOAT32)} if rope else {}
    write_gguf(path, "phi3", model.config, stored, edit=set_metadata(attn))
    return path


def test_unmappable_tensors_are_refused(tmp_path) -> None:
    path = write_with(tmp_path, drop=("rope_factors_short.weight",))
    with pytest.raises(ValueError, match="holds rope_factors_long.weight without the other"):
        load_gguf_config(path)
    path = write_with(tmp_path, **{"rope_factors_long.weight": np.ones(5, np.float32)})
    with pytest.raises(ValueError, match=r"rope_factors_long.weight has shape \[5\].*\[6\]"):
        load_gguf_config(path)
    path = write_with(tmp_path, rope=PHI4_ROPE)
    with pytest.raises(ValueError, match="attn_factor 1.5 without LongRoPE factors"):
        load_gguf_config(path)
    path = write_with(tmp_path, **{"blk.0.ffn_gate_inp.weight": np.ones((4, 32), np.float32)})
    with pytest.raises(ValueError, match="phi3 file with experts"):
        load_gguf_config(path)
