"""llama.cpp's periodic sliding-window pattern (llama_hparams::set_swa_pattern), which the
architectures with interleaved sliding layers share (gemma.py, exaone4.py, olmo2.py)."""

import numpy as np

from pagedllm.gguf.metadata import integer
from pagedllm.gguf.reader import GGUFFile


def stated_period(gguf: GGUFFile, arch: str, default: int) -> int:
    """`attention.sliding_window_pattern` where it is an integer, else `default`: the
    per-layer array a converter may write instead is one llama.cpp's exaone4 and olmo2
    loaders do not read."""
    key = f"{arch}.attention.sliding_window_pattern"
    if key in gguf.metadata and not isinstance(gguf.metadata[key], np.ndarray):
        return integer(gguf, key, minimum=0)
    return default


def periodic_sliding(period: int, layers: int) -> list[bool]:
    """Whether each layer slides: layer i unless i % period == period - 1 (a period of 0
    slides every layer, one of 1 none)."""
    return [period == 0 or i % period < period - 1 for i in range(layers)]


def layer_types(slides: list[bool]) -> list[str]:
    """transformers' `layer_types` of those flags."""
    return ["sliding_attention" if s else "full_attention" for s in slides]
