"""pagedllm/gguf/ernie4_5.py: ERNIE 4.5 dense files as convert_hf_to_gguf.py's Ernie4_5Model
writes them (config, tensors and fp32 logits against transformers: test_hf_config.py's and
test_tensor_names.py's tiny tests); here use_bias read from the biases the file holds, a
Q8_0 file run against transformers on the same rounded weights, and what is refused by name.

(Prefixed test_gguf_ as the other families' GGUF tests: test basenames must be unique.)"""

import pytest

from pagedllm.gguf.hf_config import load_gguf_config
from tests.gguf.test_gguf_olmo2 import PROMPT
from tests.gguf.test_gguf_phi3 import logits_match_transformers
from tests.gguf.tiny_gguf import gguf_tensors, tiny_model, write_gguf, write_tiny


def test_head_dim_is_key_length_and_heads_are_not_permuted(tiny_files: dict) -> None:
    """head_dim 16 from attention.key_length (hidden / heads is 8); the q rows stay as the
    checkpoint's (llama.cpp's NORM rope is transformers' GPT-J-style one)."""
    path, _, _ = tiny_files["ernie4_5"]
    config = load_gguf_config(path)
    assert (config.head_dim, config.use_bias, config.tie_word_embeddings) == (16, False, True)


def test_use_bias_file_runs_as_transformers(tmp_path) -> None:
    """Biases on every projection (use_bias): the config says so and the logits are
    transformers' on the same weights (fp32, 1e-4)."""
    model = tiny_model("ernie4_5", use_bias=True)
    path = str(tmp_path / "bias.gguf")
    write_gguf(
        path, "ernie4_5", model.config, gguf_tensors("ernie4_5", model.config, model.state_dict())
    )
    assert load_gguf_config(path).use_bias
    logits_match_transformers(path, model, PROMPT, 256)


def test_qkv_biases_alone_are_refused(tmp_path) -> None:
    """llama.cpp's graph adds q/k/v biases only; transformers' use_bias has o's and the MLP's
    too, so a file with the first alone has no config."""
    model = tiny_model("ernie4_5", use_bias=True)
    stored = gguf_tensors("ernie4_5", model.config, model.state_dict())
    kept = {n: t for n, t in stored.items() if not n.endswith(".bias") or ".attn_q" in n}
    path = str(tmp_path / "bad.gguf")
    write_gguf(path, "ernie4_5", model.config, kept)
    with pytest.raises(
        ValueError, match=r"bad.gguf: ERNIE 4.5 .*\['attn_q'\] but none of .*attn_k"
    ):
        load_gguf_config(path)


def test_missing_rms_epsilon_is_refused(tmp_path) -> None:
    path = write_tiny(
        str(tmp_path / "bad.gguf"), "ernie4_5", **{"ernie4_5.attention.layer_norm_rms_epsilon": ()}
    )
    with pytest.raises(ValueError, match="bad.gguf.*no metadata key .*rms_epsilon"):
        load_gguf_config(path)
