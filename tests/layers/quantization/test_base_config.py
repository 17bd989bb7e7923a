"""new_weight (pagedllm/layers/quantization/base_config.py): a parameter carries the
attributes it is given, and a weight_loader that is a method of its layer holds that layer
weakly, so a dropped layer (and its weights) is freed at once, not by the cyclic collector."""

import gc
import weakref

import pytest
import torch
from torch import nn

from pagedllm.layers.quantization.base_config import new_weight


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = new_weight(
            (2, 3), torch.float32, weight_loader=self.weight_loader, block=(32, 18)
        )

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        param.data.copy_(loaded_weight * 2)


def test_new_weight_carries_its_attributes_and_loads_through_its_layer() -> None:
    layer = Layer()
    assert layer.weight.block == (32, 18) and not layer.weight.requires_grad
    layer.weight.weight_loader(layer.weight, torch.ones(2, 3))
    assert torch.equal(layer.weight, torch.full((2, 3), 2.0))


def test_a_dropped_layer_is_freed_at_once_and_its_loader_then_says_so() -> None:
    gc.disable()
    try:
        layer = Layer()
        param, loader, ref = layer.weight, layer.weight.weight_loader, weakref.ref(layer)
        del layer
        assert ref() is None
    finally:
        gc.enable()
    with pytest.raises(RuntimeError, match="no longer exists"):
        loader(param, torch.ones(2, 3))
