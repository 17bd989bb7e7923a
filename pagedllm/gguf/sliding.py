"""llama.cpp's periodic sliding-window pattern (llama_hparams::set_swa_pattern), which the
architectures with interleaved sliding layers share (gemma.py, exaone4.py, olmo2.py)."""


def periodic_sliding(period: int, layers: int) -> list[bool]:
    """Whether each layer slides: layer i unless i % period == period - 1 (a period of 0
    slides every layer, one of 1 none)."""
    return [period == 0 or i % period < period - 1 for i in range(layers)]


def layer_types(slides: list[bool]) -> list[str]:
    """transformers' `layer_types` of those flags."""
    return ["sliding_attention" if s else "full_attention" for s in slides]
