"""The CPU attention backend: pagedllm._C's paged decode kernel and cache write.

Decodes read each sequence's blocks in place (scores over the keys, softmax, then values)
instead of gathering padded copies, and the cache write is one call instead of two
index_copy_. Prefill chunks run pagedllm._C's kernels too: a bf16 model's on AMX tiles or
AVX-512 BF16 dot products where the CPU has them, the others in float32 on any CPU (head
sizes multiples of 16; _custom_ops.prefill_attention decides).
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
