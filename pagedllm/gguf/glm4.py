"""GLM-4 GGUF files (llama.cpp's `glm4`: GLM-4-0414, GLM-Z1), as convert_hf_to_gguf.py's
Glm4Model writes them.

The checkpoint's tensors under gguf's names, no q/k rows permuted: llama.cpp rotates glm4's
heads in adjacent pairs (rope type NORM), as transformers' Glm4 does. `rope.dimension_count`
is the rotary width, head_dim * partial_rotary_factor (half the head in every release), and
head_dim is `attention.key_length` (or hidden / heads). `ffn_up` is the checkpoint's fused
gate_up_proj (gate then up rows, the order llama.cpp's SwiGLU splits); llama.cpp also reads
a fused `attn_qkv` (q, k then v rows), which loads as a `qkv_proj` cut at load. The four
norms: `attn_norm` (input_layernorm), `post_attention_norm` (post_self_attn_layernorm),
`ffn_norm` (post_attention_layernorm, before the MLP) and `post_ffw_norm`
(post_mlp_layernorm).

Refused: M-RoPE (`rope.dimension_sections`, GLM-4V's text model) and the extra next-token
prediction layers of `nextn_predict_layers` (GLM-OCR), which pagedllm's Glm4 does not run.
"""

from typing import Any

from pagedllm.gguf.metadata import integer
from pagedllm.gguf.reader import GGUFFile
from pagedllm.gguf.rotary import rotary_width

GLM4 = "glm4"


def glm4_kwargs(gguf: GGUFFile, arch: str, sizes: dict[str, Any]) -> dict[str, Any]:
    """GLM-4's `rope_parameters`: `sizes`' (hf_config's: theta and scaling, with head_dim)
    with the partial rotary factor the file's rotary width gives."""
    sections = f"{arch}.rope.dimension_sections"
    if sections in gguf.metadata:
        raise ValueError(f"{gguf.path}: {sections} (M-RoPE, GLM-4V) is not supported")
    nextn = integer(gguf, f"{arch}.nextn_predict_layers", 0, minimum=0)
    if nextn:
        raise ValueError(
            f"{gguf.path}: {arch}.nextn_predict_layers {nextn}: next-token prediction "
            "layers are not supported"
        )
    head_dim = sizes["head_dim"]
    rotary = rotary_width(gguf, arch, head_dim)
    partial = {"partial_rotary_factor": rotary / head_dim}
    return {"rope_parameters": sizes["rope_parameters"] | partial}
