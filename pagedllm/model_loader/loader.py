"""Build a model from a ModelConfig and load its weights on a device."""

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from pagedllm.config import ModelConfig
from pagedllm.models.registry import ModelRegistry


@contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def build_model(model_config: ModelConfig, device: str | torch.device) -> nn.Module:
    """The model's layers with uninitialised weights (device "meta": no memory at all)."""
    model_cls = ModelRegistry.resolve_model_cls(model_config.architecture)
    with default_dtype(model_config.dtype), torch.device(device):
        return model_cls(model_config.hf_config)


def iterate_weights(model_config: ModelConfig) -> Iterator[tuple[str, torch.Tensor]]:
    if model_config.gguf_file is not None:
        from pagedllm.gguf.tensor_names import iterate_gguf_weights

        return iterate_gguf_weights(model_config.gguf_file, model_config.dtype)
    from pagedllm.model_loader.safetensors import iterate_safetensors_weights

    return iterate_safetensors_weights(model_config.model, model_config.dtype)


def get_model(model_config: ModelConfig, device: str | torch.device = "cpu") -> nn.Module:
    model = build_model(model_config, device)
    with torch.no_grad():
        model.load_weights(iterate_weights(model_config))
    return model.eval()
