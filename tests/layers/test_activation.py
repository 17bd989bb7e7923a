"""SiluAndMul against the SwiGLU formula and transformers' LlamaMLP; GeluAndMul against the
GeGLU formula (F.gelu in float64) and its refusal of another form; get_act_fn's GELUs against
transformers' ACT2FN."""

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig
from transformers.activations import ACT2FN
from transformers.models.llama.modeling_llama import LlamaMLP

from pagedllm.layers.activation import GeluAndMul, SiluAndMul, get_act_fn
from pagedllm.layers.linear import MergedColumnParallelLinear, RowParallelLinear


def test_silu_and_mul_equals_silu_gate_times_up(cpu_kernels: str) -> None:
    """Reference: silu(gate) * up, with gate the first half of the last dim; the kernel's own
    e^x may differ from torch's in the last bit."""
    x = torch.randn(3, 5, 2 * 7)
    gate, up = x[..., :7], x[..., 7:]
    out = SiluAndMul()(x)
    assert out.shape == (3, 5, 7)
    exact = {"rtol": 0, "atol": 0} if cpu_kernels == "torch" else {}
    torch.testing.assert_close(out, F.silu(gate) * up, **exact)


def test_merged_mlp_with_silu_and_mul_equals_transformers_llama_mlp(cpu_kernels: str) -> None:
    """Reference: transformers' LlamaMLP, down(act(gate(x)) * up(x)), with the same weights."""
    config = LlamaConfig(
        hidden_size=16, intermediate_size=24, num_attention_heads=2, hidden_act="silu"
    )
    mlp = LlamaMLP(config).eval()
    gate_up = MergedColumnParallelLinear(16, [24, 24])
    down = RowParallelLinear(24, 16)
    gate_up.weight.weight_loader(gate_up.weight, mlp.gate_proj.weight.detach(), 0)
    gate_up.weight.weight_loader(gate_up.weight, mlp.up_proj.weight.detach(), 1)
    down.weight.weight_loader(down.weight, mlp.down_proj.weight.detach())
    x = torch.randn(4, 16)
    with torch.no_grad():
        expected = mlp(x)
    torch.testing.assert_close(down(SiluAndMul()(gate_up(x))), expected)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_and_mul_equals_gelu_gate_times_up(cpu_kernels: str, approximate: str) -> None:
    """Reference: F.gelu(gate, approximate) * up in float64, gate the first half of the
    last dim."""
    x = torch.randn(3, 5, 2 * 19) * 3
    gate, up = x.double()[..., :19], x.double()[..., 19:]
    out = GeluAndMul(approximate)(x)
    assert out.shape == (3, 5, 19)
    expected = F.gelu(gate, approximate=approximate) * up
    torch.testing.assert_close(out, expected.float(), rtol=1e-5, atol=1e-5)


def test_gelu_and_mul_refuses_another_form() -> None:
    with pytest.raises(ValueError, match="approximate must be 'none' or 'tanh', got 'erf'"):
        GeluAndMul("erf")


@pytest.mark.parametrize("name", ["gelu", "gelu_pytorch_tanh", "gelu_new"])
def test_get_act_fn_is_transformers_activation(cpu_kernels: str, name: str) -> None:
    """Reference: transformers' ACT2FN[hidden_act] (StarCoder 2's gelu_pytorch_tanh), in
    float64, elementwise on any shape."""
    x = torch.randn(3, 5, 19) * 3
    out = get_act_fn(name)(x)
    expected = ACT2FN[name](x.double()).float()
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)


def test_get_act_fn_names_what_it_supports() -> None:
    with pytest.raises(ValueError, match="hidden_act 'silu' is not supported; supported: gelu,"):
        get_act_fn("silu")
