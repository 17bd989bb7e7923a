"""pagedllm/gguf/olmo2.py: OLMo 2 files as convert_hf_to_gguf.py's Olmo2Model writes them
(config, tensors and fp32 logits against transformers: test_hf_config.py's and
test_tensor_names.py's tiny tests); here the whole-projection q/k norms, a Q8_0 file run
against transformers on the same rounded weights, and what is refused by name.

(Prefixed test_gguf_ as the other families' GGUF tests: test basenames must be unique.)"""

import gguf
import pytest
from gguf import GGUFValueType as VT

from pagedllm.gguf.hf_config import load_gguf_config
from tests.gguf.test_gguf_phi3 import logits_match_transformers
from tests.gguf.tiny_gguf import gguf_tensors, tiny_model, write_gguf, write_tiny

PROMPT = [5, 17, 60, 3, 33, 42, 7, 12, 9, 50]
# Q8_0 kernels quantize activations too (llama.cpp's scheme): near, not equal
Q8_0_ATOL = 0.02


def test_qk_norms_span_whole_projections(tiny_files: dict) -> None:
    """attn_q_norm [heads * head_dim] and attn_k_norm [kv_heads * head_dim], as OLMo 2's."""
    _, config, expected = tiny_files["olmo2"]
    assert expected["model.layers.0.self_attn.q_norm.weight"].shape == (4 * 8,)
    assert expected["model.layers.0.self_attn.k_norm.weight"].shape == (2 * 8,)
    assert not [name for name in expected if "input_layernorm" in name]


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ({"olmo2.attention.layer_norm_rms_epsilon": ()}, "no metadata key .*rms_epsilon"),
        (
            {
                "olmo2.attention.sliding_window": (4, VT.UINT32),
                "olmo2.rope.freq_base_swa": (5000.0, VT.FLOAT32),
            },
            "freq_base_swa 5000.0 differs",
        ),
    ],
)
def test_unmappable_files_are_refused(tmp_path, metadata: dict, message: str) -> None:
    path = write_tiny(str(tmp_path / "bad.gguf"), "olmo2", **metadata)
    with pytest.raises(ValueError, match=f"bad.gguf.*{message}"):
        load_gguf_config(path)


def test_olmo3_slides_three_layers_of_four(tiny_files: dict) -> None:
    """An olmo2 file with a window is OLMo 3: llama.cpp's period 4, the window read."""
    path, expected, _ = tiny_files["olmo3"]
    config = load_gguf_config(path)
    assert (config.sliding_window, config.layer_types) == (4, expected.layer_types)
    assert config.layer_types == ["sliding_attention"] * 3 + ["full_attention"]


def test_olmo3_yarn_scales_global_layers_only(tmp_path) -> None:
    """llama.cpp rotates OLMo 3's sliding layers without the file's YaRN: transformers'
    Olmo3 with YaRN as the global layers' rope only, fp32 logits within 1e-4."""
    yarn = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0}
    yarn["original_max_position_embeddings"] = 64
    default = {"rope_type": "default", "rope_theta": 10000.0}
    model = tiny_model(
        "olmo3", rope_parameters={"full_attention": yarn, "sliding_attention": default}
    )
    path = str(tmp_path / "yarn.gguf")
    rope = {"type": gguf.RopeScalingType.YARN, "factor": 4.0, "original": 64}
    write_gguf(
        path, "olmo3", model.config, gguf_tensors("olmo3", model.config, model.state_dict()), rope
    )
    config = load_gguf_config(path)
    assert config.rope_parameters == {"full_attention": yarn, "sliding_attention": default}
    logits_match_transformers(path, model, PROMPT, 256)


def test_a_window_of_0_is_olmo2(tmp_path) -> None:
    path = write_tiny(
        str(tmp_path / "w0.gguf"), "olmo2", **{"olmo2.attention.sliding_window": (0, VT.UINT32)}
    )
    assert load_gguf_config(path).architectures == ["Olmo2ForCausalLM"]
