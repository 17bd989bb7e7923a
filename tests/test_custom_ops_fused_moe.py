"""_custom_ops.fused_moe: which kernel runs a FusedMoE layer's float experts."""

import torch

from pagedllm._custom_ops import MoEKernel, select_moe_kernel
from pagedllm.batch_invariant import set_batch_invariant
from pagedllm.layers.fused_moe import FusedMoE
from tests.devices import needs_cuda


def test_cpu_weights_keep_the_grouped_loop() -> None:
    layer = FusedMoE(4, 2, 32, 32)
    torch.nn.init.normal_(layer.w13_weight)
    torch.nn.init.normal_(layer.w2_weight)
    layer.quant_method.process_weights_after_loading(layer)
    assert layer.moe_kernel is MoEKernel.GROUPED


@needs_cuda
def test_cuda_weights_take_triton_outside_batch_invariant_mode() -> None:
    w13 = torch.zeros(4, 64, 32, device="cuda")
    assert select_moe_kernel(w13) is MoEKernel.TRITON
    set_batch_invariant(True)
    try:
        assert select_moe_kernel(w13) is MoEKernel.GROUPED
    finally:
        set_batch_invariant(False)
