"""Activations: the gated ones of Llama-style MLPs, and plain GELU for MLPs without a gate."""

import torch

from pagedllm import _custom_ops
from pagedllm.layers.inference_module import InferenceModule


class SiluAndMul(InferenceModule):
    """[..., 2d] -> silu(x[..., :d]) * x[..., d:], the SwiGLU of Llama-style MLPs."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _custom_ops.silu_and_mul(x)


def _gelu_form(approximate: str) -> str:
    """torch's F.gelu `approximate`, checked: "none" (the erf form) or "tanh"."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    return approximate


class GeluAndMul(InferenceModule):
    """[..., 2d] -> gelu(x[..., :d]) * x[..., d:], the GeGLU of Gemma's MLPs; approximate
    "tanh" (gelu_pytorch_tanh) or "none" (the exact erf form), as torch's F.gelu."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        self.approximate = _gelu_form(approximate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _custom_ops.gelu_and_mul(x, self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


def get_act_and_mul_fn(name: str) -> InferenceModule:
    """The gated activation of a config's `hidden_act` / `hidden_activation` (vLLM's
    get_act_and_mul_fn): act(x[..., :d]) * x[..., d:]."""
    makers = {
        "silu": SiluAndMul,
        "gelu": lambda: GeluAndMul("none"),
        "gelu_pytorch_tanh": lambda: GeluAndMul("tanh"),
        "gelu_new": lambda: GeluAndMul("tanh"),
    }
    if name not in makers:
        raise ValueError(f"hidden_act {name!r} is not supported; supported: {', '.join(makers)}")
    return makers[name]()


class GELU(InferenceModule):
    """gelu(x), elementwise: the activation of StarCoder 2's MLP (c_fc, gelu, c_proj);
    approximate as torch's F.gelu."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        self.approximate = _gelu_form(approximate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _custom_ops.gelu(x, self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


def get_act_fn(name: str) -> InferenceModule:
    """The activation of a config's `hidden_act` for an MLP without a gate (vLLM's
    get_act_fn): the GELUs."""
    makers = {
        "gelu": lambda: GELU("none"),
        "gelu_pytorch_tanh": lambda: GELU("tanh"),
        "gelu_new": lambda: GELU("tanh"),
    }
    if name not in makers:
        raise ValueError(f"hidden_act {name!r} is not supported; supported: {', '.join(makers)}")
    return makers[name]()
