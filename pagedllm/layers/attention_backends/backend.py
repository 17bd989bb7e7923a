"""The interface every attention backend implements; `selector.get_attn_backend` picks one.

Shapes follow forward_context.py: T new tokens of B sequences, H query heads and KV kv heads
of size D; each layer's caches are [num_blocks, block_size, KV, D].
"""

from typing import Protocol

import torch

from pagedllm.forward_context import AttentionMetadata


class AttentionBackend(Protocol):
    name: str
    """vLLM's name for it (attention_backend=...)."""
    requirement: str
    """Where it runs, in words (for the error when it is named where it cannot)."""
    reads_fp8_kv_cache: bool
    """Whether it takes a float8 KV cache (kv_cache_dtype="fp8")."""

    @staticmethod
    def supports(device: torch.device, dtype: torch.dtype) -> bool:
        """Whether this backend runs attention of this dtype on this device."""
        ...

    def write_kv(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        """Stores this step's key/value [T, KV, D] in the caches at slot_mapping [T]."""
        ...

    def forward(
        self,
        query: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        attn_metadata: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        """query [T, H, D] -> [T, H, D]: each sequence's new queries attend causally over all
        seq_len tokens of its cache, the last q_len of which are the new ones."""
        ...
