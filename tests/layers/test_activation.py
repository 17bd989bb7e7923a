"""SiluAndMul against the SwiGLU formula and transformers' LlamaMLP."""

import torch
import torch.nn.functional as F
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP

from pagedllm.layers.activation import SiluAndMul
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
