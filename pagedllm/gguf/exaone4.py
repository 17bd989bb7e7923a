"""EXAONE 4.0 GGUF files (llama.cpp's `exaone4`), as convert_hf_to_gguf.py's Exaone4Model
writes them.

The checkpoint's tensors under gguf's names, no q/k rows permuted (llama.cpp rotates
exaone4's heads NEOX-style, halves, as transformers does): OLMo 2's post-norms
(`post_attention_norm`, `post_ffw_norm`, no norm in front of the blocks) and per-head q/k
norms (`attn_q_norm`, `attn_k_norm` [head_dim]). Llama 3 rope scaling comes as the tensor
`rope_freqs`, read as llama's (hf_config.py).

Which layers slide is llama.cpp's rule, not the file's (llama_model_exaone4's
load_arch_hparams): only a model of 64 layers (the 32B) slides, with a window of
`attention.sliding_window` (default 4096) on layers i with i % p < p - 1, p being
`attention.sliding_window_pattern` where it is an integer (default 4; the per-layer array
the converter writes is not read), and its other layers are global and unrotated (NoPE).
Any other model (the 1.2B) has no window and rotates every layer, whatever the file says.
transformers' Exaone4 runs both as such, through `sliding_window` and `layer_types`.
"""

from typing import Any

from pagedllm.gguf.metadata import integer
from pagedllm.gguf.reader import GGUFFile
from pagedllm.gguf.sliding import layer_types, periodic_sliding, stated_period

EXAONE4 = "exaone4"
# llama.cpp's hybrid exaone4: its layer count, window and pattern period where none is stated
_HYBRID_LAYERS = 64
_DEFAULT_WINDOW = 4096
_DEFAULT_PERIOD = 4


def exaone4_kwargs(gguf: GGUFFile, arch: str, sizes: dict[str, Any]) -> dict[str, Any]:
    """Exaone4Config's `sliding_window` and `layer_types` as llama.cpp runs the file."""
    layers = sizes["num_hidden_layers"]
    _check_swa_theta(gguf, arch, sizes["rope_parameters"]["rope_theta"])
    if layers != _HYBRID_LAYERS:
        return {"sliding_window": None, "layer_types": ["full_attention"] * layers}
    window = integer(gguf, f"{arch}.attention.sliding_window", _DEFAULT_WINDOW, minimum=1)
    period = stated_period(gguf, arch, _DEFAULT_PERIOD)
    types = layer_types(periodic_sliding(period, layers))
    return {"sliding_window": window, "sliding_window_pattern": period, "layer_types": types}


def _check_swa_theta(gguf: GGUFFile, arch: str, theta: float) -> None:
    """ValueError for a sliding layers' theta (`rope.freq_base_swa`) other than the model's:
    llama.cpp's exaone4 graph rotates every layer at `rope.freq_base`."""
    key = f"{arch}.rope.freq_base_swa"
    if key in gguf.metadata and gguf.metadata[key] != theta:
        raise ValueError(
            f"{gguf.path}: {key} {gguf.metadata[key]} differs from {arch}.rope.freq_base "
            f"{theta}; a separate theta for sliding layers is not supported"
        )
