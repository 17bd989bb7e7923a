"""The interface every attention backend implements; `selector.get_attn_backend` picks one.

Shapes follow forward_context.py: T new tokens of B sequences, H query heads and KV kv heads
of size D; each layer's caches are [num_blocks, block_size, KV, D].
"""

import enum
from typing import ClassVar, Protocol

import torch

from pagedllm.forward_context import AttentionMetadata


class AttentionCGSupport(enum.Enum):
    """vLLM's name: which steps a backend's forward may run in a captured CUDA graph
    (executor/cuda_graph.py). A graph replays the kernels it recorded with the arguments
    they had, so a graph-safe forward reads every length from the metadata's device tensors
    (seq_lens, block_tables, slot_mapping, query_start_loc), never from its Python lists,
    takes `max_seq_len` as an upper bound (at capture it is max_model_len), and never
    reads a device tensor on the host."""

    NEVER = 0
    UNIFORM_SINGLE_TOKEN_DECODE = 1
    """Steps whose every sequence decodes one token (the graphs' padding rows included)."""


class AttentionBackend(Protocol):
    name: str
    """vLLM's name for it (attention_backend=...)."""
    cudagraph_support: ClassVar[AttentionCGSupport]
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
        sliding_window: int = 0,
        logits_soft_cap: float = 0.0,
    ) -> torch.Tensor:
        """query [T, H, D] -> [T, H, D]: each sequence's new queries attend causally over all
        seq_len tokens of its cache, the last q_len of which are the new ones; where
        sliding_window > 0, a query at position p sees only positions p - sliding_window + 1
        .. p; where logits_soft_cap > 0, each score s becomes cap * tanh(s / cap) before the
        softmax."""
        ...
