"""Quantization schemes by the name users pass as `quantization` (vLLM's registry)."""

from pagedllm.layers.quantization.base_config import QuantizationConfig
from pagedllm.layers.quantization.gguf import GGUFConfig
from pagedllm.layers.quantization.int8 import Int8Config

QUANTIZATION_METHODS: dict[str, type[QuantizationConfig]] = {
    "gguf": GGUFConfig,
    "int8": Int8Config,
    # quantized HF checkpoints: their layers converted at load to GGUF blocks
    # (pagedllm/model_loader/quantized_weights.py)
    "gptq": GGUFConfig,
    "awq": GGUFConfig,
    "compressed-tensors": GGUFConfig,
    "fp8": GGUFConfig,
}


def get_quantization_config(name: str) -> type[QuantizationConfig]:
    """The config class registered as `name`; ValueError naming the known ones."""
    if name not in QUANTIZATION_METHODS:
        raise ValueError(f"quantization {name!r} is not one of {', '.join(QUANTIZATION_METHODS)}")
    return QUANTIZATION_METHODS[name]
