"""The CPU attention backend: pagedllm._C's paged decode kernel and cache write.

Decodes read each sequence's blocks in place (one pass over keys and values, online softmax)
instead of gathering padded copies, and the cache write is one call instead of two
index_copy_. Prefill chunks have no kernel and run the reference's torch code.
"""

import torch

from pagedllm import _custom_ops
from pagedllm.layers.attention_backends.torch_sdpa import TorchSdpaBackend


class CpuAttentionBackend(TorchSdpaBackend):
    name = "cpu"

    @staticmethod
    def supports(device: torch.device, dtype: torch.dtype) -> bool:
        return device.type == "cpu" and dtype == torch.float32 and _custom_ops.has_cpu_kernels()

    def write_kv(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        _custom_ops.reshape_and_cache(key, value, k_cache, v_cache, slot_mapping)

    def decode(
        self,
        query: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        max_seq_len: int,
        scale: float,
    ) -> torch.Tensor:
        return _custom_ops.paged_decode_attention(
            query, k_cache, v_cache, block_tables, seq_lens, max_seq_len, scale
        )
