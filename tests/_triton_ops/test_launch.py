"""launch.for_device: a compiled Triton kernel refuses CPU tensors with a clear error."""

import os

import pytest
import torch

pytest.importorskip("triton")

from pagedllm._triton_ops import interpreting  # noqa: E402
from pagedllm._triton_ops.fused_moe import fused_moe_kernel  # noqa: E402
from pagedllm._triton_ops.launch import for_device  # noqa: E402


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="compiled kernels only")
def test_compiled_kernel_refuses_cpu_tensors() -> None:
    assert not interpreting()
    with pytest.raises(ValueError, match="fused_moe_kernel got CPU tensors.*TRITON_INTERPRET=1"):
        for_device(fused_moe_kernel, torch.device("cpu"))
    assert for_device(fused_moe_kernel, torch.device("cuda")) is fused_moe_kernel
