"""pagedllm's fast ops: each runs pagedllm._C's kernel where it applies, else its torch code.

This is the one place that decides. A kernel applies when the extension is built and the
tensors are CPU float32 (or bfloat16 where the kernel has that variant) without autograd
(plus an op's own limits, such as head sizes for attention); the op then adapts the layout
the kernel needs (contiguous, int32 tables) and calls it through `_cpu_kernels`, the checked
boundary to the C code. Everywhere else (GPUs, other dtypes, no compiler at install) it runs
the torch definition in `_torch_ops`, which is also the reference the kernels are tested
against. Layers call these functions and never ask which path ran.

The ops live by family in this package (common.py: when a kernel applies; linear.py,
rowwise.py, attention.py, gguf.py, fused_moe.py); callers import them from here.
"""

from pagedllm._custom_ops.attention import (
    paged_decode_attention,
    paged_decode_attention_kernel,
    prefill_attention,
    prefill_attention_kernel,
    reshape_and_cache,
    reshape_and_cache_kernel,
)
from pagedllm._custom_ops.common import cpu_kernels_apply, has_cpu_kernels
from pagedllm._custom_ops.fused_moe import (
    MoEKernel,
    fused_experts,
    select_moe_kernel,
    topk_softmax,
)
from pagedllm._custom_ops.gguf import (
    gguf_dequantize,
    gguf_embedding,
    gguf_linear,
    gguf_pack,
    gguf_packed_embedding,
    gguf_packed_linear,
)
from pagedllm._custom_ops.linear import (
    LinearKernel,
    linear,
    packs_linear_weight,
    prepack_linear_weight,
    select_linear_kernel,
)
from pagedllm._custom_ops.rowwise import (
    add,
    argmax,
    fused_add_layer_norm,
    fused_add_rms_norm,
    gelu,
    gelu_and_mul,
    layer_norm,
    lora_masked_add,
    rms_norm,
    rotary_embedding,
    scale,
    silu_and_mul,
)

__all__ = [
    "LinearKernel",
    "MoEKernel",
    "add",
    "argmax",
    "lora_masked_add",
    "cpu_kernels_apply",
    "fused_add_layer_norm",
    "fused_add_rms_norm",
    "fused_experts",
    "gguf_dequantize",
    "gguf_embedding",
    "gguf_linear",
    "gguf_pack",
    "gguf_packed_embedding",
    "gguf_packed_linear",
    "has_cpu_kernels",
    "layer_norm",
    "linear",
    "paged_decode_attention",
    "paged_decode_attention_kernel",
    "prefill_attention",
    "prefill_attention_kernel",
    "packs_linear_weight",
    "prepack_linear_weight",
    "reshape_and_cache",
    "reshape_and_cache_kernel",
    "rms_norm",
    "rotary_embedding",
    "scale",
    "select_linear_kernel",
    "select_moe_kernel",
    "gelu",
    "gelu_and_mul",
    "silu_and_mul",
    "topk_softmax",
]
