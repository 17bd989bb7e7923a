"""pagedllm/gguf/gemma.py: what llama.cpp assumes of Gemma files that do not say it (its
llama_model::load_hparams for gemma2 and gemma3), the attention scale against the released
models' transformers configs, and norms stored plus one (convert_hf_to_gguf.py's GemmaModel)
held by the model exactly as stored.

(Not test_gemma.py: tests/models has one, and test basenames must be unique.)"""

import gguf
import numpy as np
import pytest
import torch
from gguf import GGUFValueType as VT

from pagedllm.config import ModelConfig
from pagedllm.gguf.gemma import query_pre_attn_scalar
from pagedllm.gguf.hf_config import load_gguf_config
from pagedllm.layers.attention_backends.selector import use_attn_backend
from pagedllm.model_loader.loader import get_model
from tests.gguf.tiny_gguf import gguf_tensors, tiny_model, write_gguf, write_tiny

SLIDING, FULL = "sliding_attention", "full_attention"


@pytest.mark.parametrize(
    ("arch", "hidden", "heads", "head_dim", "layers", "expected"),
    [
        ("gemma2", 2304, 8, 256, 26, 256),  # gemma-2-2b
        ("gemma2", 3584, 16, 256, 42, 256),  # gemma-2-9b
        ("gemma2", 4608, 32, 128, 46, 144),  # gemma-2-27b: hidden / heads
        ("gemma3", 1152, 4, 256, 26, 256),  # gemma-3-1b
        ("gemma3", 3840, 16, 256, 48, 256),  # gemma-3-12b
        ("gemma3", 5376, 32, 128, 62, 168),  # gemma-3-27b: hidden / heads
    ],
)
def test_query_pre_attn_scalar_is_the_released_configs(
    arch: str, hidden: int, heads: int, head_dim: int, layers: int, expected: int
) -> None:
    """Reference: each model's config.json on the Hugging Face hub (query_pre_attn_scalar)."""
    sizes = dict(
        hidden_size=hidden, num_attention_heads=heads, head_dim=head_dim, num_hidden_layers=layers
    )
    assert query_pre_attn_scalar(arch, sizes) == expected


def test_gemma2_without_window_or_caps_takes_llama_cpps_defaults(tmp_path) -> None:
    """llama.cpp: n_swa 4096, attention cap 50, final cap 30 where the keys are absent."""
    absent = {f"gemma2.{k}": () for k in ("attention.sliding_window", "attn_logit_softcapping")}
    absent["gemma2.final_logit_softcapping"] = ()
    config = load_gguf_config(write_tiny(str(tmp_path / "g2.gguf"), "gemma2", **absent))
    assert (config.sliding_window, config.layer_types) == (4096, [SLIDING, FULL])
    assert (config.attn_logit_softcapping, config.final_logit_softcapping) == (50.0, 30.0)
    assert config.rope_parameters == {"rope_type": "default", "rope_theta": 10000.0}


@pytest.mark.parametrize(
    ("metadata", "sliding"),
    [
        ({}, [0, 1, 2, 3, 4, 6]),  # llama.cpp's period 6
        ({"gemma3.attention.sliding_window_pattern": (3, VT.UINT32)}, [0, 1, 3, 4, 6]),
        ({"gemma3.attention.sliding_window_pattern": (0, VT.UINT32)}, list(range(7))),
        (
            {"gemma3.attention.sliding_window_pattern": ([True] * 6 + [False], VT.ARRAY, VT.BOOL)},
            [0, 1, 2, 3, 4, 5],
        ),
        ({"gemma3.attention.sliding_window": ()}, []),  # no window: every layer global
        ({"gemma3.attention.sliding_window": (0, VT.UINT32)}, []),
    ],
)
def test_gemma3_layer_types_as_llama_cpp_reads_them(
    tmp_path, metadata: dict, sliding: list[int]
) -> None:
    config = load_gguf_config(write_tiny(str(tmp_path / "g3.gguf"), "gemma3", **metadata))
    assert config.layer_types == [SLIDING if i in sliding else FULL for i in range(7)]
    assert config.sliding_window == (5 if sliding else None)


def test_gemma3_bad_pattern_array_names_it(tmp_path) -> None:
    metadata = {"gemma3.attention.sliding_window_pattern": ([True, False], VT.ARRAY, VT.BOOL)}
    path = write_tiny(str(tmp_path / "g3.gguf"), "gemma3", **metadata)
    with pytest.raises(ValueError, match=r"sliding_window_pattern.*one bool per layer \(7\)"):
        load_gguf_config(path)


def test_gemma3_rope_of_global_and_sliding_layers(tmp_path) -> None:
    """Global layers: rope.freq_base and the linear scaling; sliding ones: rope.freq_base_swa,
    10000 where absent (llama.cpp's), unscaled."""
    expected = {"rope_type": "linear", "rope_theta": 50000.0, "factor": 4.0}
    config = load_gguf_config(write_tiny(str(tmp_path / "g3.gguf"), "gemma3"))
    assert config.rope_parameters == {
        FULL: expected,
        SLIDING: {"rope_type": "default", "rope_theta": 10000.0},
    }
    swa_base = {"gemma3.rope.freq_base_swa": (100.0, VT.FLOAT32)}
    config = load_gguf_config(write_tiny(str(tmp_path / "g3_swa.gguf"), "gemma3", **swa_base))
    assert config.rope_parameters[SLIDING] == {"rope_type": "default", "rope_theta": 100.0}


def test_norms_are_held_exactly_as_stored(tmp_path) -> None:
    """Every norm of the loaded model (fp32) holds the file's stored value bit for bit, which
    llama.cpp multiplies by: float32 values of every size, below 0.5 included, where
    subtracting the 1 in float32 would round."""
    model = tiny_model("gemma3")
    stored = gguf_tensors("gemma3", model.config, model.state_dict())
    gen = np.random.default_rng(0)
    norms = [name for name in stored if name.endswith("norm.weight")]
    for name in norms:
        magnitude = 10.0 ** gen.uniform(-6, 2, stored[name].shape)
        stored[name] = (magnitude * gen.choice([-1, 1], stored[name].shape)).astype(np.float32)
    path = str(tmp_path / "norms.gguf")
    write_gguf(path, "gemma3", model.config, stored)
    with use_attn_backend("TORCH_SDPA"):
        ours = get_model(ModelConfig.create(path, dtype="float32"))
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA3, model.config.num_hidden_layers)
    params = dict(ours.named_parameters())
    for name, _ in model.named_parameters():
        if name.endswith("norm.weight"):
            gguf_name = names.get_name(name.removesuffix(".weight")) + ".weight"
            assert torch.equal(params[name], torch.from_numpy(stored[gguf_name])), name
