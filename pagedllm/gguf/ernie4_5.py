"""ERNIE 4.5 dense GGUF files (llama.cpp's `ernie4_5`: ERNIE-4.5-0.3B), as
convert_hf_to_gguf.py's Ernie4_5Model writes them.

Llama's tensor names and metadata (TextModel's: head_dim as `attention.key_length`, 128 in
every release, not hidden / heads), no q/k rows permuted: llama.cpp rotates ernie4_5's
heads in adjacent pairs (rope type NORM), as transformers' Ernie4_5 does (GPT-J style). The
converter splits the fused qkv_proj and up_gate_proj of older checkpoints into q, k, v and
gate, up, so the file holds them apart.

Biases: transformers' `use_bias` puts them on q, k, v, o and the MLP's three projections
(every release has none); llama.cpp's graph adds q, k and v biases only. A file whose
layers hold some biases but not o's and the MLP's is refused, as no config describes it.
"""

from typing import Any

from pagedllm.gguf.reader import GGUFFile

ERNIE4_5 = "ernie4_5"
# the biases transformers' use_bias adds beside q/k/v's, which llama.cpp's graph does not
_USE_BIAS_ONLY = ("attn_output", "ffn_gate", "ffn_up", "ffn_down")


def ernie4_5_kwargs(gguf: GGUFFile) -> dict[str, Any]:
    """Ernie4_5Config's `use_bias`: whether the layers hold biases, all of use_bias's."""
    biased = {name.split(".")[2] for name in gguf.tensors if name.endswith(".bias")}
    if not biased:
        return {"use_bias": False}
    missing = [
        name for name in ("attn_q", "attn_k", "attn_v", *_USE_BIAS_ONLY) if name not in biased
    ]
    if missing:
        raise ValueError(
            f"{gguf.path}: ERNIE 4.5 layers hold biases of {sorted(biased)} but none of "
            f"{missing}; transformers' use_bias (which pagedllm runs) puts a bias on every "
            "projection"
        )
    return {"use_bias": True}
