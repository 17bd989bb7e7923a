"""The CPU attention backend: pagedllm._C's paged decode kernel and cache write.

Decodes read each sequence's blocks in place (scores over the keys, softmax, then values)
instead of gathering padded copies, and the cache write is one call instead of two
index_copy_. Prefill chunks run pagedllm._C's float32 prefill kernel (bf16 widened), whose
rows follow the decode kernel's arithmetic: each row of a step's output is the bits of that
token computed alone, whatever its batch, chunk or cached context.
"""

import torch

from pagedllm import _custom_ops
from pagedllm.layers.attention_backends.torch_sdpa import TorchSdpaBackend


class CpuAttentionBackend(TorchSdpaBackend):
    name = "cpu"
    ops = _custom_ops

    @staticmethod
    def supports(device: torch.device, dtype: torch.dtype) -> bool:
        return (
            device.type == "cpu"
            and dtype in (torch.float32, torch.bfloat16)
            and _custom_ops.has_cpu_kernels()
        )
