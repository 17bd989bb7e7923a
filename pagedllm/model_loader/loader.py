"""Build a model from a ModelConfig and load its weights on a device."""

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

from pagedllm.config import ModelConfig
from pagedllm.layers.quantization import get_quantization_config
from pagedllm.layers.quantization.base_config import QuantizationConfig
from pagedllm.layers.rotary_embedding import use_max_model_len
from pagedllm.logger import init_logger
from pagedllm.model_loader.pooling_model import drop_lm_head, pooling_keep, pooling_weights
from pagedllm.model_loader.quantized_weights import (
    checkpoint_tensor_types,
    iterate_quantized_weights,
)
from pagedllm.model_loader.weight_arena import move_weights_to_arena
from pagedllm.models.rank_weights import rank_weight_filter
from pagedllm.models.registry import ModelRegistry
from pagedllm.models.weight_loading import WeightsMapper

logger = init_logger(__name__)


@contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def get_quant_config(model_config: ModelConfig) -> QuantizationConfig | None:
    """The model's quantization config: for a GGUF file, the type of each of its tensors
    (read from the header), for a quantized checkpoint the GGUF type each of its layers
    runs in, by the model's names of them; None when the weights stay in
    model_config.dtype."""
    if model_config.quantization is None:
        return None
    settings = {}
    model_cls = ModelRegistry.resolve_model_cls(model_config.architecture)
    if model_config.quantization == "gguf":
        from pagedllm.gguf.tensor_names import hf_tensor_types

        settings["tensor_types"] = hf_tensor_types(model_config.gguf_file)
    elif model_config.checkpoint_quant is not None:
        settings["tensor_types"] = checkpoint_tensor_types(
            model_config.model, model_config.checkpoint_quant, model_cls.hf_to_pagedllm_mapper
        )
    quant_config = get_quantization_config(model_config.quantization).from_config(settings)
    quant_config.packed_modules_mapping = model_cls.packed_modules_mapping()
    return quant_config


def build_model(
    model_config: ModelConfig,
    device: str | torch.device,
    quant_config: QuantizationConfig | None = None,
) -> nn.Module:
    """The model's layers with uninitialised weights (device "meta": no memory at all), in
    the format quant_config gives each layer (get_quant_config(model_config) if None)."""
    if quant_config is None:
        quant_config = get_quant_config(model_config)
    model_cls = ModelRegistry.resolve_model_cls(model_config.architecture)
    try:
        with (
            default_dtype(model_config.dtype),
            torch.device(device),
            use_max_model_len(model_config.max_model_len),
        ):
            return model_cls(model_config.hf_config, quant_config)
    except RuntimeError as e:  # torch.OutOfMemoryError is one
        if not _is_allocation_failure(e):
            raise
        raise ValueError(
            f"cannot allocate the weights of {model_config.model!r} on {device}: "
            f"{str(e).splitlines()[0]}"
        ) from e


def _is_allocation_failure(error: RuntimeError) -> bool:
    """torch's out-of-memory errors: its CPU allocator's and the GPUs'."""
    text = str(error)
    return isinstance(error, torch.OutOfMemoryError) or "can't allocate memory" in text


def iterate_weights(
    model_config: ModelConfig,
    quant_config: QuantizationConfig | None = None,
    keep: Callable[[str], bool] | None = None,
    mapper: WeightsMapper | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors under the model's names (`mapper`'s renames). Those the
    mapper drops (a vision tower) or whose model name `keep` rejects are never read; a
    quantized layer comes out as its blocks where quant_config's is_raw says so of its
    model name."""
    mapper = WeightsMapper() if mapper is None else mapper
    keep = mapper.keep(keep or _everything)
    is_raw = getattr(quant_config, "is_raw", None)
    keep_blocks = None if is_raw is None else mapper.keep(is_raw)
    if model_config.gguf_file is not None:
        from pagedllm.gguf.tensor_names import iterate_gguf_weights

        weights = iterate_gguf_weights(
            model_config.gguf_file, model_config.dtype, keep_blocks, keep
        )
    elif model_config.checkpoint_quant is not None:
        weights = iterate_quantized_weights(
            model_config.model, model_config.checkpoint_quant, model_config.dtype, keep_blocks, keep
        )
    else:
        from pagedllm.model_loader.safetensors import iterate_safetensors_weights

        weights = iterate_safetensors_weights(model_config.model, model_config.dtype, keep)
    return mapper.apply(weights)


def _everything(name: str) -> bool:
    return True


def weight_bytes(model: nn.Module, buffers: bool = True) -> int:
    """Bytes of the model's parameters, and of its buffers (RoPE tables) unless told not
    to; a tied weight counts once."""
    tensors = [*model.parameters(), *(model.buffers() if buffers else ())]
    return sum(t.numel() * t.element_size() for t in tensors)


def get_model(model_config: ModelConfig, device: str | torch.device = "cpu") -> nn.Module:
    quant_config = get_quant_config(model_config)
    model = build_model(model_config, device, quant_config)
    owned = rank_weight_filter(model)  # this stage's tensors, this rank's experts
    mapper = model.hf_to_pagedllm_mapper
    if model_config.runner_type == "pooling":
        drop_lm_head(model)
    with torch.no_grad():
        if model_config.load_format == "dummy":
            initialize_dummy_weights(model)
        else:
            if model_config.runner_type == "pooling":
                keep = pooling_keep(owned)
                weights = pooling_weights(iterate_weights(model_config, quant_config, keep, mapper))
            else:
                weights = iterate_weights(model_config, quant_config, owned, mapper)
            model.load_weights(weights)
        for module in model.modules():
            method = getattr(module, "quant_method", None)
            if method is not None:
                method.process_weights_after_loading(module)
    model.eval()
    if torch.device(device).type == "cpu":
        _weights_in_huge_pages(model)
    scheme = model_config.quantization or str(model_config.dtype).removeprefix("torch.")
    logger.info("weights: %.1f MB resident (%s)", weight_bytes(model) / 1e6, scheme)
    return model


def initialize_dummy_weights(model: nn.Module, low: float = -1e-3, high: float = 1e-3) -> None:
    """vLLM's dummy weights: every parameter uniform in [low, high), drawn where it lies
    (on a GPU, nothing crosses the bus), seeded so that runs repeat."""
    generators: dict[torch.device, torch.Generator] = {}
    for param in model.parameters():
        if param.device not in generators:
            generators[param.device] = torch.Generator(param.device).manual_seed(0)
        if param.is_floating_point():
            param.uniform_(low, high, generator=generators[param.device])


def _weights_in_huge_pages(model: nn.Module) -> None:
    moved = move_weights_to_arena(model)
    if moved is None:
        logger.info("weights: in 4 KiB pages (the OS grants no transparent huge pages)")
        return
    _, stats = moved
    logger.info(
        "weights: %.1f of %.1f MB moved into memory that asks for 2 MiB pages (%.2f s)",
        stats.moved_bytes / 1e6,
        stats.total_bytes / 1e6,
        stats.seconds,
    )
