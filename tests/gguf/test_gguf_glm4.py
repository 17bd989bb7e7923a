"""pagedllm/gguf/glm4.py: GLM-4 files as convert_hf_to_gguf.py's Glm4Model writes them
(config, tensors and fp32 logits against transformers: test_hf_config.py's and
test_tensor_names.py's tiny tests); here the fused attn_qkv llama.cpp also reads, a Q8_0
file run against transformers on the same rounded weights, and what is refused by name.

(Not test_glm4.py: tests/models has one, and test basenames must be unique.)"""

import numpy as np
import pytest
from gguf import GGUFValueType as VT

from pagedllm.gguf.hf_config import load_gguf_config
from tests.gguf.test_gguf_olmo2 import PROMPT
from tests.gguf.test_gguf_phi3 import logits_match_transformers
from tests.gguf.tiny_gguf import (
    gguf_tensors,
    set_metadata,
    tiny_model,
    write_gguf,
    write_tiny,
)


def test_rotary_width_is_partial(tiny_files: dict) -> None:
    """rope.dimension_count 8 of head_dim 16 (key_length, not hidden / heads = 8)."""
    config = load_gguf_config(tiny_files["glm4"][0])
    assert (config.head_dim, config.rope_parameters["partial_rotary_factor"]) == (16, 0.5)


def test_head_dim_without_key_length_is_not_the_rotary_width(tmp_path) -> None:
    """No attention.key_length: head_dim is hidden / heads (8), as llama.cpp takes it, not
    rope.dimension_count (4), the rotary width."""
    model = tiny_model("glm4", head_dim=8)
    path = str(tmp_path / "nokey.gguf")
    stored = gguf_tensors("glm4", model.config, model.state_dict())
    write_gguf(
        path, "glm4", model.config, stored, edit=set_metadata({"glm4.attention.key_length": ()})
    )
    config = load_gguf_config(path)
    assert (config.head_dim, config.rope_parameters["partial_rotary_factor"]) == (8, 0.5)
    logits_match_transformers(path, model, PROMPT, 256)


def fuse_qkv(stored: dict[str, np.ndarray], layers: int) -> dict[str, np.ndarray]:
    """The file's q, k and v (weights and biases) as one attn_qkv, q then k then v rows."""
    out = dict(stored)
    for i in range(layers):
        for suffix in ("weight", "bias"):
            parts = [out.pop(f"blk.{i}.attn_{p}.{suffix}") for p in "qkv"]
            out[f"blk.{i}.attn_qkv.{suffix}"] = np.concatenate(parts)
    return out


def test_fused_qkv_runs_as_the_separate_projections(tmp_path) -> None:
    model = tiny_model("glm4")
    path = str(tmp_path / "qkv.gguf")
    stored = fuse_qkv(gguf_tensors("glm4", model.config, model.state_dict()), 2)
    write_gguf(path, "glm4", model.config, stored)
    logits_match_transformers(path, model, PROMPT, 256)


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ({"glm4.attention.layer_norm_rms_epsilon": ()}, "no metadata key .*rms_epsilon"),
        ({"glm4.rope.dimension_count": (13, VT.UINT32)}, "dimension_count 13 must be even"),
        ({"glm4.rope.dimension_sections": ([8, 0, 0, 0], VT.ARRAY, VT.INT32)}, "M-RoPE"),
        ({"glm4.nextn_predict_layers": (1, VT.UINT32)}, "next-token prediction"),
    ],
)
def test_unmappable_files_are_refused(tmp_path, metadata: dict, message: str) -> None:
    path = write_tiny(str(tmp_path / "bad.gguf"), "glm4", **metadata)
    with pytest.raises(ValueError, match=f"bad.gguf.*{message}"):
        load_gguf_config(path)
