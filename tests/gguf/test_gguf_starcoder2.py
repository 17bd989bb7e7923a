"""pagedllm/gguf/starcoder2.py: StarCoder 2 files as convert_hf_to_gguf.py's StarCoder2Model
writes them (config, tensors and fp32 logits against transformers: test_hf_config.py's and
test_tensor_names.py's tiny tests); here the LayerNorm and MLP fields, a tied LM head, a Q8_0
file run against transformers on the same rounded weights, and a missing epsilon refused.

(Prefixed test_gguf_ as the other families' GGUF tests: test basenames must be unique.)"""

import pytest

from pagedllm.gguf.hf_config import load_gguf_config
from tests.gguf.test_gguf_olmo2 import PROMPT
from tests.gguf.test_gguf_phi3 import logits_match_transformers
from tests.gguf.tiny_gguf import gguf_tensors, tiny_model, write_gguf, write_tiny


def test_layer_norm_and_mlp_fields(tiny_files: dict) -> None:
    path, expected, tensors = tiny_files["starcoder2"]
    config = load_gguf_config(path)
    assert config.norm_epsilon == pytest.approx(expected.norm_epsilon, rel=1e-6)
    for field in ("use_bias", "hidden_act", "sliding_window"):
        assert getattr(config, field) == getattr(expected, field), field
    assert not hasattr(config, "rms_norm_eps") or config.rms_norm_eps is None
    assert "model.layers.1.input_layernorm.bias" in tensors
    assert "model.layers.1.mlp.c_fc.bias" in tensors


def test_tied_lm_head(tmp_path) -> None:
    """No output.weight: the LM head is the embedding, as StarCoder 2's checkpoints tie it."""
    model = tiny_model("starcoder2", tie_word_embeddings=True)
    path = str(tmp_path / "tied.gguf")
    stored = gguf_tensors("starcoder2", model.config, model.state_dict())
    assert "output.weight" not in stored
    write_gguf(path, "starcoder2", model.config, stored)
    assert load_gguf_config(path).tie_word_embeddings
    logits_match_transformers(path, model, PROMPT, 256)


def test_missing_layer_norm_epsilon_is_refused(tmp_path) -> None:
    path = write_tiny(
        str(tmp_path / "bad.gguf"), "starcoder2", **{"starcoder2.attention.layer_norm_epsilon": ()}
    )
    with pytest.raises(ValueError, match="bad.gguf has no metadata key .*layer_norm_epsilon"):
        load_gguf_config(path)
