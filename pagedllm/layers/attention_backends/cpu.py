"""The CPU attention backend: pagedllm._C's paged decode kernel and cache write.

Decodes read each sequence's blocks in place (scores over the keys, softmax, then values)
instead of gathering padded copies, and the cache write is one call instead of two
index_copy_. Prefill chunks run pagedllm._C's float32 prefill kernel (bf16 widened), whose
rows follow the decode kernel's arithmetic: each row of a step's output is the bits of that
token computed alone, whatever its batch, chunk or cached context.

The selector picks this backend where the kernels take every call (a CPU, a float32 or
bf16 model, the extension built; the KV cache is float32 or bf16), so its ops call the
kernels alone: what was selected is what runs, and a tensor the kernels cannot take raises
ValueError instead of silently taking torch's path.
"""

import torch

from pagedllm import _custom_ops
from pagedllm.layers.attention_backends.torch_sdpa import TorchSdpaBackend


class _KernelOps:
    reshape_and_cache = staticmethod(_custom_ops.reshape_and_cache_kernel)
    paged_decode_attention = staticmethod(_custom_ops.paged_decode_attention_kernel)
    prefill_attention = staticmethod(_custom_ops.prefill_attention_kernel)


class CpuAttentionBackend(TorchSdpaBackend):
    name = "CPU_ATTN"
    requirement = "float32 or bfloat16 on CPU, with pagedllm._C built"
    reads_fp8_kv_cache = False
    ops = _KernelOps

    @staticmethod
    def supports(device: torch.device, dtype: torch.dtype) -> bool:
        return (
            device.type == "cpu"
            and dtype in (torch.float32, torch.bfloat16)
            and _custom_ops.has_cpu_kernels()
        )
