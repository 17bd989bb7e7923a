"""pagedllm/gguf/tensor_shapes.py: metadata that disagrees with the tensors is a ValueError
naming the file, the tensor, its shape and what the metadata gives, raised from the header
before any model is allocated (reference: llama.cpp, which checks every tensor's shape against
the hyperparameters in llama_model_loader::create_tensor before it allocates)."""

import re

import numpy as np
import pytest
from gguf import GGUFValueType as VT

from pagedllm.entrypoints.cli import main
from pagedllm.gguf.hf_config import load_gguf_config
from tests.gguf.tiny_gguf import gguf_tensors, tiny_model, write_gguf, write_tiny

# tiny llama: hidden 32, 4 heads, 2 kv heads, head_dim 8, ffn 48, vocab 64, 2 layers
MISMATCHES = {
    # a hidden size of 2^18 would allocate a [64, 2^18] embedding, [2^18, 2^18] linears
    "llama.embedding_length": (2**18, "token_embd.weight has shape [64, 32]", "[64, 262144]"),
    "llama.feed_forward_length": (2**32 - 1, "blk.0.ffn_", "[4294967295, 32]"),
    "llama.attention.head_count": (8, "blk.0.attn_q.weight has shape [32, 32]", "[64, 32]"),
    "llama.attention.head_count_kv": (4, "blk.0.attn_k.weight has shape [16, 32]", "[32, 32]"),
    "llama.attention.key_length": (16, "blk.0.attn_q.weight has shape [32, 32]", "[64, 32]"),
}


@pytest.mark.parametrize("key", list(MISMATCHES))
def test_metadata_that_disagrees_with_a_tensor_names_both(tmp_path, key: str) -> None:
    value, tensor, expected = MISMATCHES[key]
    path = write_tiny(str(tmp_path / "bad.gguf"), **{key: (value, VT.UINT32)})
    message = f"bad.gguf: tensor {tensor}.*the metadata .* gives {expected}"
    with pytest.raises(ValueError, match=re.escape(message).replace(r"\.\*", ".*")):
        load_gguf_config(path)


def test_expert_count_that_disagrees_with_the_experts(tmp_path) -> None:
    path = write_tiny(
        str(tmp_path / "moe.gguf"), "qwen3moe", **{"qwen3moe.expert_count": (8, VT.UINT32)}
    )
    with pytest.raises(
        ValueError, match=r"ffn_\w+.weight has shape \[4, .*gives \[8, .*expert_count"
    ):
        load_gguf_config(path)


@pytest.mark.parametrize("norm", ["post_attention_norm", "post_ffw_norm"])
def test_gemma2_post_norms_are_checked(tmp_path, norm: str) -> None:
    """Gemma 2's (and 3's) norms after attention and the MLP are [hidden] as the others."""
    model = tiny_model("gemma2")
    tensors = gguf_tensors("gemma2", model.config, model.state_dict())
    tensors[f"blk.1.{norm}.weight"] = np.ones(48, np.float32)
    path = str(tmp_path / "norm.gguf")
    write_gguf(path, "gemma2", model.config, tensors)
    with pytest.raises(ValueError, match=rf"blk.1.{norm}.weight has shape \[48\].*\[32\]"):
        load_gguf_config(path)


@pytest.mark.parametrize("layers", [1, 3, 10**7])
def test_block_count_must_be_the_files_layers(tmp_path, layers: int) -> None:
    path = write_tiny(str(tmp_path / "layers.gguf"), **{"llama.block_count": (layers, VT.UINT32)})
    message = f"block_count is {layers}, but the file holds tensors of 2 layers"
    with pytest.raises(ValueError, match=message):
        load_gguf_config(path)


def test_inspect_exits_2_on_ten_million_layers_rather_than_sizing_them(tmp_path, capsys) -> None:
    path = write_tiny(str(tmp_path / "layers.gguf"), **{"llama.block_count": (10**7, VT.UINT32)})
    with pytest.raises(SystemExit) as exit_info:
        main(["inspect", path])
    assert exit_info.value.code == 2
    assert "block_count is 10000000" in capsys.readouterr().err


# tiny phi3: hidden 32, 2 heads, 1 kv head, head_dim 16, ffn 48; qkv and gate/up fused
PHI3_MISMATCHES = {
    "phi3.attention.head_count_kv": (2, "attn_qkv.weight has shape [64, 32]", "[96, 32]"),
    "phi3.feed_forward_length": (64, "ffn_up.weight has shape [96, 32]", "[128, 32]"),
}


@pytest.mark.parametrize("key", list(PHI3_MISMATCHES))
def test_phi3_fused_tensors_are_checked(tmp_path, key: str) -> None:
    """Phi-3's attn_qkv holds q, k and v rows, its ffn_up gate and up rows."""
    value, tensor, expected = PHI3_MISMATCHES[key]
    path = write_tiny(str(tmp_path / "bad.gguf"), "phi3", **{key: (value, VT.UINT32)})
    message = f"tensor blk.0.{tensor}.*gives {expected}"
    with pytest.raises(ValueError, match=re.escape(message).replace(r"\.\*", ".*")):
        load_gguf_config(path)
