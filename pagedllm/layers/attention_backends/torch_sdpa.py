"""The reference attention backend: paged attention in torch ops alone, on any device.

A step's batch mixes prefill chunks (q_len > 1, possibly after cached context) and decodes
(q_len == 1). All decodes run as one padded SDPA call; prefill chunks run one sequence at a
time. The plan comes from the metadata's Python lengths, so nothing waits on the device.
A prefill expands kv heads with stride 0, never copying keys per query head.

It never calls pagedllm._C, so the tests hold the other backends against it.
"""

import torch

from pagedllm import _torch_ops
from pagedllm.forward_context import AttentionMetadata
from pagedllm.layers.attention_backends.backend import AttentionCGSupport


class TorchSdpaBackend:
    """`ops` holds the cache write and the decode and prefill attention; a subclass swaps it
    for `_custom_ops` to run them as kernels and keeps the rest."""

    name = "TORCH_SDPA"
    requirement = "any device and dtype"
    reads_fp8_kv_cache = True
    ops = _torch_ops
    # Its decode gathers every sequence's keys padded to max_seq_len: in a graph, fixed at
    # max_model_len, each step would read the whole cache span of every row.
    cudagraph_support = AttentionCGSupport.NEVER

    @staticmethod
    def supports(device: torch.device, dtype: torch.dtype) -> bool:
        return True

    def write_kv(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        self.ops.reshape_and_cache(key, value, k_cache, v_cache, slot_mapping)

    def decode(
        self,
        query: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        max_seq_len: int,
        scale: float,
        sliding_window: int = 0,
        logits_soft_cap: float = 0.0,
    ) -> torch.Tensor:
        """query [B, H, D], one new token per sequence -> [B, H, D]."""
        return self.ops.paged_decode_attention(
            query,
            k_cache,
            v_cache,
            block_tables,
            seq_lens,
            max_seq_len,
            scale,
            sliding_window,
            logits_soft_cap,
        )

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
        """query [T, H, D] -> [T, H, D] (see AttentionBackend.forward)."""
        md = attn_metadata
        window = (sliding_window, logits_soft_cap)
        if all(n == 1 for n in md.query_lens_cpu):
            return self.decode(
                query,
                k_cache,
                v_cache,
                md.block_tables,
                md.seq_lens,
                md.max_seq_len,
                scale,
                *window,
            )
        output = torch.empty(query.shape, dtype=query.dtype, device=query.device)
        decodes = md.decode_rows
        if decodes is not None:
            decoded = self.decode(
                query.index_select(0, decodes.rows),
                k_cache,
                v_cache,
                md.block_tables.index_select(0, decodes.seq_idx),
                md.seq_lens.index_select(0, decodes.seq_idx),
                decodes.max_seq_len,
                scale,
                *window,
            )
            output.index_copy_(0, decodes.rows, decoded)
        starts = md.query_starts_cpu
        for i, n in enumerate(md.query_lens_cpu):
            if n > 1:
                output[starts[i] : starts[i + 1]] = self.ops.prefill_attention(
                    query[starts[i] : starts[i + 1]],
                    k_cache,
                    v_cache,
                    md.block_tables[i],
                    md.seq_lens_cpu[i],
                    scale,
                    *window,
                )
        return output
