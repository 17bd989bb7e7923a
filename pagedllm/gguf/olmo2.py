"""OLMo 2 and OLMo 3 GGUF files (llama.cpp's `olmo2`), as convert_hf_to_gguf.py's
Olmo2Model writes them.

The checkpoint's tensors under gguf's names, no q/k rows permuted: llama.cpp rotates olmo2's
heads NEOX-style (halves), as transformers does. There is no norm in front of the blocks;
`post_attention_norm` and `post_ffw_norm` norm each block's output (Olmo2's
post_attention_layernorm and post_feedforward_layernorm, Gemma 2's GGUF names), and q and k
are normed over their whole projections: `attn_q_norm` [heads * head_dim], `attn_k_norm`
[kv_heads * head_dim]. Every norm takes `attention.layer_norm_rms_epsilon`, which llama.cpp
requires.

OLMo 3 shares the architecture and adds `attention.sliding_window` above 0; llama.cpp
(llama_model_olmo2's load_arch_hparams and graph) then slides layers i with i % p < p - 1,
p being `attention.sliding_window_pattern` where it is an integer (default 4: three layers
of four), and rotates its sliding layers at `rope.freq_base` without the file's rope
scaling (no YaRN, no attn_factor) and its global layers with it: transformers' Olmo3Config
with `layer_types` and one `rope_parameters` per layer type.
"""

from typing import Any

from pagedllm.gguf.metadata import integer
from pagedllm.gguf.reader import GGUFFile
from pagedllm.gguf.sliding import layer_types, periodic_sliding, stated_period

OLMO2 = "olmo2"
OLMO3 = ("olmo3", "Olmo3ForCausalLM")
"""transformers' model_type and class of an olmo2 file with a sliding window."""
_DEFAULT_PERIOD = 4


def is_olmo3(gguf: GGUFFile, arch: str) -> bool:
    """Whether an olmo2 file is OLMo 3: an `attention.sliding_window` above 0."""
    return integer(gguf, f"{arch}.attention.sliding_window", 0, minimum=0) > 0


def olmo3_kwargs(gguf: GGUFFile, arch: str, sizes: dict[str, Any]) -> dict[str, Any]:
    """Olmo3Config's window, layer types and per-type rope; `sizes` holds hf_config's
    rope_parameters (theta and the file's scaling), which the global layers take."""
    full = sizes["rope_parameters"]
    theta = full["rope_theta"]
    swa_theta = gguf.metadata.get(f"{arch}.rope.freq_base_swa", theta)
    if swa_theta != theta:
        raise ValueError(
            f"{gguf.path}: {arch}.rope.freq_base_swa {swa_theta} differs from "
            f"{arch}.rope.freq_base {theta}; llama.cpp's olmo2 graph rotates sliding layers "
            "at rope.freq_base, which pagedllm follows only where they agree"
        )
    period = stated_period(gguf, arch, _DEFAULT_PERIOD)
    types = layer_types(periodic_sliding(period, sizes["num_hidden_layers"]))
    return {
        "sliding_window": integer(gguf, f"{arch}.attention.sliding_window"),
        "layer_types": types,
        "rope_parameters": {
            "full_attention": full,
            "sliding_attention": {"rope_type": "default", "rope_theta": theta},
        },
    }
