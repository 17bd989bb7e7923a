"""Tiny GGUF models whose weights are stored in the natively supported block types.

The legacy types are written by gguf's own quantizer from a random HF model's weights; the
k-quants (which gguf cannot quantize) as random valid blocks with small scales. The plan
mixes types the way llama.cpp's files do, so a fused qkv holds three types (segments) and
each of the eight native types appears at least once; Phi-3's qkv and gate/up, stored fused,
are Q8_0 and Q4_1.
"""

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.quants import quantize

from tests.gguf.tiny_gguf import gguf_tensors, tiny_model, write_gguf
from tests.gguf_blocks import random_blocks

SHAPE = dict(
    hidden_size=256,
    intermediate_size=512,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    moe_intermediate_size=256,
)
"""Every row length a multiple of 256, so every type's blocks fit."""
ARCH_SHAPE = {
    # Phi-4's: plain rope (TINY's LongRoPE factors are for its smaller heads) and no window
    # (the CPU attention kernels take none)
    "phi3": dict(
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, sliding_window=None
    ),
}

PLAN = {
    "token_embd": Q.Q8_0,
    "attn_q": Q.Q4_K,
    "attn_k": Q.Q5_K,
    "attn_v": Q.Q6_K,
    "attn_qkv": Q.Q8_0,
    "attn_output": Q.Q4_0,
    "ffn_gate": Q.Q4_1,
    "ffn_up": Q.Q4_1,
    "ffn_down": Q.Q5_0,
    "ffn_gate_exps": Q.Q5_1,
    "ffn_up_exps": Q.Q5_1,
    "ffn_down_exps": Q.Q4_K,
    "output": Q.Q5_1,
}
_K_QUANT_SCALES = {Q.Q4_K: (1e-4, 4e-4), Q.Q5_K: (5e-5, 2e-4), Q.Q6_K: (2e-5, 1e-4)}


def _stored(name: str, array: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, Q]:
    kind = name.split(".")[-2]
    qtype = PLAN.get(kind)
    if qtype is None or array.ndim < 2:
        return array, Q.F32
    if qtype in _K_QUANT_SCALES:
        rows, cols = int(np.prod(array.shape[:-1])), array.shape[-1]
        blocks = random_blocks(qtype, rows, cols, rng, _K_QUANT_SCALES[qtype])
        return blocks.reshape(*array.shape[:-1], -1), qtype
    return quantize(array.astype(np.float32), qtype), qtype


def write_quantized_gguf(path: str, arch: str, **overrides: object) -> None:
    """A tiny random `arch` model (tests/gguf/tiny_gguf.py) with SHAPE, stored per PLAN."""
    model = tiny_model(arch, **SHAPE, **ARCH_SHAPE.get(arch, {}), **overrides)
    tensors = gguf_tensors(arch, model.config, model.state_dict())
    rng = np.random.default_rng(0)
    stored = {name: _stored(name, array, rng) for name, array in tensors.items()}
    write_gguf(path, arch, model.config, stored)
