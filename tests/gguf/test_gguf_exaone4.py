"""pagedllm/gguf/exaone4.py: EXAONE 4.0 files as convert_hf_to_gguf.py's Exaone4Model writes
them (the 1.2B's layout, config, tensors and fp32 logits against transformers:
test_hf_config.py's and test_tensor_names.py's tiny tests); here llama.cpp's sliding rule
(only a 64-layer model slides, NoPE on its global layers) run against transformers, Llama 3
rope scaling from rope_freqs, a Q8_0 file, and what is refused by name.

(Prefixed test_gguf_ as the other families' GGUF tests: test basenames must be unique.)"""

import pytest
from gguf import GGUFValueType as VT

from pagedllm.gguf.hf_config import load_gguf_config
from tests.gguf.test_gguf_olmo2 import PROMPT
from tests.gguf.test_gguf_phi3 import logits_match_transformers
from tests.gguf.test_hf_config import llama3_rope_freqs
from tests.gguf.tiny_gguf import (
    gguf_tensors,
    set_metadata,
    tiny_model,
    write_gguf,
    write_tiny,
)

HYBRID = dict(num_hidden_layers=64, sliding_window=4, layer_types=None)
"""The 32B's layout at tiny sizes: 64 layers, three sliding of every four (the config's
sliding_window_pattern 4), a window of 4 the prompt outgrows."""


def write_model(path: str, model, **metadata: tuple) -> str:
    stored = gguf_tensors("exaone4", model.config, model.state_dict())
    write_gguf(path, "exaone4", model.config, stored, edit=set_metadata(metadata))
    return path


def test_64_layers_slide_three_of_four_without_rope_on_global_layers(tmp_path) -> None:
    """Reference: transformers' Exaone4 on the same weights (its sliding layers rotate, its
    global ones use no position embedding), fp32 within 1e-4."""
    model = tiny_model("exaone4", **HYBRID)
    path = write_model(str(tmp_path / "hybrid.gguf"), model)
    config = load_gguf_config(path)
    assert config.sliding_window == 4
    assert config.layer_types == model.config.layer_types
    assert config.layer_types[:4] == ["sliding_attention"] * 3 + ["full_attention"]
    logits_match_transformers(path, model, PROMPT, 256)


def test_integer_pattern_sets_the_period(tmp_path) -> None:
    """An integer attention.sliding_window_pattern is llama.cpp's period (the converter's
    per-layer array is not read); a window absent is 4096."""
    model = tiny_model("exaone4", **HYBRID)
    metadata = {
        "exaone4.attention.sliding_window_pattern": (2, VT.UINT32),
        "exaone4.attention.sliding_window": (),
    }
    config = load_gguf_config(write_model(str(tmp_path / "p2.gguf"), model, **metadata))
    assert config.sliding_window == 4096
    assert config.layer_types[:4] == ["sliding_attention", "full_attention"] * 2


def test_other_layer_counts_never_slide(tmp_path) -> None:
    """llama.cpp slides a 64-layer exaone4 only: a 2-layer file stating a window runs
    without one, every layer rotated."""
    model = tiny_model("exaone4", sliding_window=4, layer_types=None)
    config = load_gguf_config(write_model(str(tmp_path / "small.gguf"), model))
    assert config.sliding_window is None
    assert config.layer_types == ["full_attention"] * 2
    logits_match_transformers(str(tmp_path / "small.gguf"), tiny_model("exaone4"), PROMPT, 256)


def test_llama3_rope_scaling_from_rope_freqs(tmp_path) -> None:
    """EXAONE 4.0's Llama 3 rope scaling, which the converter writes as rope_freqs."""
    rope = {
        "rope_type": "llama3",
        "rope_theta": 1000000.0,
        "factor": 16.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    model = tiny_model("exaone4", rope_parameters=rope)
    path = str(tmp_path / "llama3.gguf")
    stored = gguf_tensors("exaone4", model.config, model.state_dict())
    stored["rope_freqs.weight"] = llama3_rope_freqs(8, 1000000.0, 16.0)
    write_gguf(path, "exaone4", model.config, stored)
    assert load_gguf_config(path).rope_parameters == rope
    logits_match_transformers(path, model, PROMPT, 256)


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ({"exaone4.attention.layer_norm_rms_epsilon": ()}, "no metadata key .*rms_epsilon"),
        ({"exaone4.rope.freq_base_swa": (5000.0, VT.FLOAT32)}, "freq_base_swa 5000.0 differs"),
    ],
)
def test_unmappable_files_are_refused(tmp_path, metadata: dict, message: str) -> None:
    path = write_tiny(str(tmp_path / "bad.gguf"), "exaone4", **metadata)
    with pytest.raises(ValueError, match=f"bad.gguf.*{message}"):
        load_gguf_config(path)
