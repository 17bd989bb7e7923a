"""A sentence-transformers folder's Dense modules (vLLM's "ST projector"): the pooled vector
goes through each module's linear layer and activation, in order, before Matryoshka
truncation and the L2 normalisation, as sentence-transformers runs them.

Each module's weights are in its folder, `model.safetensors` or `pytorch_model.bin`
(`linear.weight` [out, in], `linear.bias` [out]); they run in float32 beside the pooling.
"""

import os

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from pagedllm.pooler_config import DenseModule, PoolerConfig

_ACTIVATIONS = {
    "torch.nn.modules.linear.Identity": lambda x: x,
    "torch.nn.modules.activation.Tanh": torch.tanh,
    "torch.nn.modules.activation.ReLU": F.relu,
    "torch.nn.modules.activation.GELU": F.gelu,
    "torch.nn.modules.activation.Sigmoid": torch.sigmoid,
    "torch.nn.modules.activation.SiLU": F.silu,
}


class StProjector:
    """The Dense modules of a pooling model, applied to a pooled vector [H] -> [out]."""

    def __init__(self, modules: tuple[DenseModule, ...]) -> None:
        self.layers = [(*_load_weights(m), _ACTIVATIONS[m.activation]) for m in modules]

    def __call__(self, pooled: torch.Tensor) -> torch.Tensor:
        """On the weights' device (the CPU: a vector a request, beside the engine's host
        work), wherever the pooled rows were."""
        for weight, bias, activation in self.layers:
            pooled = activation(F.linear(pooled.to(weight.device, torch.float32), weight, bias))
        return pooled


def load_st_projector(config: PoolerConfig | None) -> StProjector | None:
    """The projector of a pooling model whose checkpoint has Dense modules, else None."""
    return StProjector(config.dense) if config is not None and config.dense else None


def _load_weights(module: DenseModule) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`linear.weight` and `linear.bias` from the module's folder, float32, checked."""
    safetensors = os.path.join(module.path, "model.safetensors")
    if os.path.isfile(safetensors):
        tensors = load_file(safetensors)
    else:
        bin_file = os.path.join(module.path, "pytorch_model.bin")
        if not os.path.isfile(bin_file):
            raise ValueError(
                f"Dense module {module.path!r} has no model.safetensors or pytorch_model.bin"
            )
        tensors = torch.load(bin_file, map_location="cpu", weights_only=True)
    weight = tensors.get("linear.weight")
    if weight is None or tuple(weight.shape) != (module.out_features, module.in_features):
        raise ValueError(
            f"Dense module {module.path!r}: linear.weight must be "
            f"[{module.out_features}, {module.in_features}], got "
            f"{None if weight is None else list(weight.shape)}"
        )
    bias = tensors.get("linear.bias") if module.bias else None
    if module.bias and (bias is None or tuple(bias.shape) != (module.out_features,)):
        raise ValueError(
            f"Dense module {module.path!r}: linear.bias must be [{module.out_features}]"
        )
    return weight.float(), None if bias is None else bias.float()
