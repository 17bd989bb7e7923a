"""Random valid GGUF blocks for the quantized-kernel tests.

Every bit pattern of a block's quants and packed sub-block scales is valid; only the fp16
scales need care (a random pattern may be inf or NaN), so they are drawn as finite values.
"""

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

Q = GGMLQuantizationType
SUPPORTED_TYPES = (Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q4_K, Q.Q5_K, Q.Q6_K)
"""The types pagedllm runs natively."""

# byte offsets of each type's fp16 scale fields within a block
FP16_FIELDS = {
    Q.Q8_0: (0,),
    Q.Q4_0: (0,),
    Q.Q4_1: (0, 2),
    Q.Q5_0: (0,),
    Q.Q5_1: (0, 2),
    Q.Q4_K: (0, 2),
    Q.Q5_K: (0, 2),
    Q.Q6_K: (208,),
}


def random_blocks(
    qtype: GGMLQuantizationType,
    rows: int,
    cols: int,
    rng: np.random.Generator,
    scales: tuple[float, float] = (1e-3, 2e-2),
) -> np.ndarray:
    """uint8 [rows, cols / block_size * type_size]: rows of random valid blocks of `qtype`
    whose fp16 scales lie in +-[scales] (the default gives values of order 0.01-1 for the
    legacy types; k-quants multiply by sub-block scales of up to 63 or 127 as well)."""
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    if cols % block_size:
        raise ValueError(f"{qtype.name} rows hold whole blocks of {block_size}, not {cols}")
    blocks = rng.integers(0, 256, (rows * cols // block_size, type_size), dtype=np.uint8)
    for offset in FP16_FIELDS[qtype]:
        magnitude = rng.uniform(*scales, blocks.shape[0])
        sign = rng.choice([-1.0, 1.0], blocks.shape[0])
        scale = (magnitude * sign).astype(np.float16)
        blocks[:, offset : offset + 2] = scale.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, -1)
