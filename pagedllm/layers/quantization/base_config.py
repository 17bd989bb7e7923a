"""The quantization seam, as in vLLM: a QuantizationConfig hands each layer a method that
creates the layer's weights, prepares them after loading and runs the layer's matmul.

Layers name what they are with `quant_kind` (a LayerKind) rather than being type-checked
here, so this package never imports the layers built on it.
"""

import enum
import inspect
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import torch
from torch import nn


def new_weight(shape: tuple[int, ...], dtype: torch.dtype, **attrs: Any) -> nn.Parameter:
    """An uninitialised inference parameter (default device) carrying `attrs` (its
    weight_loader, a block format, ...)."""
    param = nn.Parameter(torch.empty(shape, dtype=dtype), requires_grad=False)
    for name, value in attrs.items():
        setattr(param, name, _weakly_bound(value) if inspect.ismethod(value) else value)
    return param


def _weakly_bound(method: Callable[..., Any]) -> Callable[..., Any]:
    """`method`, holding its object by a weak reference.

    A layer's weight_loader is a method of the layer that owns the parameter; held as it
    is, layer -> parameter -> method -> layer is a reference cycle, which only Python's
    cyclic collector frees, whenever it next runs a full pass. Until then a dropped
    model's weights stay in memory, and since they are views of one weight arena, one
    such layer keeps all of them."""
    ref = weakref.WeakMethod(method)

    def call(*args: Any, **kwargs: Any) -> Any:
        bound = ref()
        if bound is None:
            raise RuntimeError("the layer this parameter's loader belongs to no longer exists")
        return bound(*args, **kwargs)

    return call


class LayerKind(enum.Enum):
    LINEAR = "linear"
    EMBEDDING = "embedding"
    LM_HEAD = "lm_head"
    FUSED_MOE = "fused_moe"


class QuantizeMethodBase(ABC):
    """Owns a layer's weights: their creation, their preparation after loading, their use."""

    @abstractmethod
    def create_weights(self, layer: nn.Module, *args: Any, **kwargs: Any) -> None:
        """Register the layer's weight parameters."""

    def process_weights_after_loading(self, layer: nn.Module) -> None:  # noqa: B027
        """Prepare the loaded weights for `apply` (quantize, repack); nothing by default."""

    def weight_rows(self, param: nn.Parameter, offset: int, size: int) -> torch.Tensor:
        """Output rows [offset, offset + size) of a weight: where a checkpoint shard is
        copied. Rows are rows for every format pagedllm stores (blocks run along them)."""
        return param.data.narrow(param.dim() - 2, offset, size)


class LinearMethodBase(QuantizeMethodBase):
    @abstractmethod
    def create_weights(
        self,
        layer: nn.Module,
        input_size_per_partition: int,
        output_partition_sizes: list[int],
        input_size: int,
        output_size: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs: Any,
    ) -> None:
        """Register `layer.weight` for this rank's [sum(output_partition_sizes),
        input_size_per_partition] matrix; extra_weight_attrs (the weight_loader) are set on
        it."""

    @abstractmethod
    def apply(
        self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """x [..., in] -> [..., out] = x W^T (+ bias)."""


class EmbeddingMethodBase(LinearMethodBase):
    """A vocabulary matrix: looked up by the embedding, multiplied by the LM head."""

    @abstractmethod
    def embedding(self, layer: nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
        """Rows of the weight: [...] ids -> [..., dim]."""


class FusedMoEMethodBase(QuantizeMethodBase):
    @abstractmethod
    def create_weights(
        self,
        layer: nn.Module,
        num_experts: int,
        hidden_size: int,
        intermediate_size_per_partition: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs: Any,
    ) -> None:
        """Register `layer.w13_weight` [E, 2 I_p, H] and `layer.w2_weight` [E, H, I_p]."""

    @abstractmethod
    def apply_expert(self, layer: nn.Module, x: torch.Tensor, expert_id: int) -> torch.Tensor:
        """One expert's SwiGLU MLP on its tokens: [n, H] -> [n, H]."""

    def apply(
        self, layer: nn.Module, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
    ) -> torch.Tensor:
        """All of the layer's experts on x [T, H] routed as topk_ids [T, K] with weights
        topk_weights [T, K] -> [T, H], the weighted sum over k. By default the layer runs
        each active expert's apply_expert over its tokens (FusedMoE.apply_experts); a
        method with a fused kernel for all experts replaces this."""
        return layer.apply_experts(x, topk_weights, topk_ids)


class QuantizationConfig(ABC):
    """One quantization scheme: its name, how it is built, and the method of each layer."""

    packed_modules_mapping: dict[str, list[str]] = {}
    """Fused parameter names and the checkpoint names they hold, e.g. "qkv_proj" ->
    ["q_proj", "k_proj", "v_proj"]; set from the model class by the loader."""

    @classmethod
    @abstractmethod
    def get_name(cls) -> str:
        """The name users pass as `quantization`."""

    @classmethod
    @abstractmethod
    def from_config(cls, config: dict[str, Any]) -> "QuantizationConfig":
        """Build from a dict of settings (a checkpoint's quantization_config, or what the
        loader read from a GGUF file's header)."""

    @abstractmethod
    def get_quant_method(self, layer: nn.Module, prefix: str) -> QuantizeMethodBase | None:
        """The method for `layer`, whose parameters are named `prefix`.weight etc.; None for
        a layer this scheme leaves in float."""
