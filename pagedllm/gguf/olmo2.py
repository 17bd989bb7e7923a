"""OLMo 2 GGUF files (llama.cpp's `olmo2`), as convert_hf_to_gguf.py's Olmo2Model writes them.

The checkpoint's tensors under gguf's names, no q/k rows permuted: llama.cpp rotates olmo2's
heads NEOX-style (halves), as transformers does. There is no norm in front of the blocks;
`post_attention_norm` and `post_ffw_norm` norm each block's output (Olmo2's
post_attention_layernorm and post_feedforward_layernorm, Gemma 2's GGUF names), and q and k
are normed over their whole projections: `attn_q_norm` [heads * head_dim], `attn_k_norm`
[kv_heads * head_dim]. Every norm takes `attention.layer_norm_rms_epsilon`, which llama.cpp
requires.

OLMo 3 shares the architecture and adds `attention.sliding_window` (llama.cpp then slides
three layers of four); such a file is refused, as its per-layer rotary scaling is not mapped.
"""

from pagedllm.gguf.metadata import integer
from pagedllm.gguf.reader import GGUFFile

OLMO2 = "olmo2"


def check_olmo2(gguf: GGUFFile, arch: str) -> None:
    """ValueError for an OLMo 3 file (a sliding window above 0), which is not supported."""
    window = integer(gguf, f"{arch}.attention.sliding_window", 0, minimum=0)
    if window:
        raise ValueError(
            f"{gguf.path}: {arch}.attention.sliding_window {window} makes this OLMo 3, "
            "whose GGUF files are not supported (OLMo 2's have no window)"
        )
