"""The rotary width a GGUF file states, for architectures whose rotary embedding turns part of
each head (llama.cpp's `rope.dimension_count`, n_rot): phi3 and glm4."""

from pagedllm.gguf.metadata import integer
from pagedllm.gguf.reader import GGUFFile


def rotary_width(gguf: GGUFFile, arch: str, head_dim: int) -> int:
    """`rope.dimension_count` (the whole head where absent, as llama.cpp defaults n_rot);
    ValueError unless it is even, at most head_dim, and a fraction of head_dim that
    transformers' `int(head_dim * partial_rotary_factor)` turns back into it."""
    rotary = integer(gguf, f"{arch}.rope.dimension_count", head_dim)
    if rotary > head_dim or rotary % 2 or int(head_dim * (rotary / head_dim)) != rotary:
        raise ValueError(
            f"{gguf.path}: {arch}.rope.dimension_count {rotary} must be even and at most "
            f"head_dim {head_dim}"
        )
    return rotary
