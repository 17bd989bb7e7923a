"""InferenceModule: a call is forward itself, without nn.Module's hook dispatch."""

import torch

from pagedllm.layers.inference_module import InferenceModule
from pagedllm.layers.layernorm import RMSNorm


def test_call_runs_forward_and_skips_hooks() -> None:
    """Reference: forward's own result; a registered forward hook is documented not to run."""
    norm = RMSNorm(8)
    assert isinstance(norm, InferenceModule)
    calls = []
    norm.register_forward_hook(lambda *args: calls.append(args))
    x = torch.randn(3, 8)
    assert torch.equal(norm(x), norm.forward(x))
    assert calls == []
