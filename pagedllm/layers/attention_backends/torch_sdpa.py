"""The reference attention backend: paged attention in torch ops alone, on any device.

A step's batch mixes prefill chunks (q_len > 1, possibly after cached context) and decodes
(q_len == 1). All decodes run as one padded SDPA call; prefill chunks run one sequence at a
time. The plan comes from the metadata's Python lengths, so nothing waits on the device.
A prefill expands kv heads with stride 0, never copying keys per query head.

It never calls pagedllm._C, so the tests hold the other backends against it.
"""

import torch
import torch.nn.functional as F

from pagedllm import _torch_ops
from pagedllm.forward_context import AttentionMetadata


class TorchSdpaBackend:
    """`ops` holds the cache write and the decode attention; a subclass swaps it for
    `_custom_ops` to run them as kernels and keeps the rest."""

    name = "torch_sdpa"
    ops = _torch_ops

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
    ) -> torch.Tensor:
        """query [B, H, D], one new token per sequence -> [B, H, D]."""
        return self.ops.paged_decode_attention(
            query, k_cache, v_cache, block_tables, seq_lens, max_seq_len, scale
        )

    def forward(
        self,
        query: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        attn_metadata: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        """query [T, H, D] -> [T, H, D] (see AttentionBackend.forward)."""
        md = attn_metadata
        if all(n == 1 for n in md.query_lens_cpu):
            return self.decode(
                query, k_cache, v_cache, md.block_tables, md.seq_lens, md.max_seq_len, scale
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
            )
            output.index_copy_(0, decodes.rows, decoded)
        starts = md.query_starts_cpu
        for i, n in enumerate(md.query_lens_cpu):
            if n > 1:
                output[starts[i] : starts[i + 1]] = _prefill_attention(
                    query[starts[i] : starts[i + 1]],
                    k_cache,
                    v_cache,
                    md.block_tables[i],
                    md.seq_lens_cpu[i],
                    scale,
                )
        return output


def _prefill_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_len: int,
    scale: float,
) -> torch.Tensor:
    """query [n, H, D] at positions seq_len - n .. seq_len - 1 -> [n, H, D].

    With cached context the causal mask is aligned bottom-right: query j sees keys
    0 .. seq_len - n + j.
    """
    num_queries = query.shape[0]
    block_size = k_cache.shape[1]
    table = block_table[None, : -(-seq_len // block_size)]
    key = _torch_ops.gather_blocks(k_cache, table, query.dtype)[0, :seq_len]
    value = _torch_ops.gather_blocks(v_cache, table, query.dtype)[0, :seq_len]
    context_len = seq_len - num_queries
    mask = None
    if context_len > 0:
        mask = torch.ones(num_queries, seq_len, dtype=torch.bool, device=query.device)
        mask = mask.tril(context_len)
    # [1, heads, tokens, D]; enable_gqa lets query head h read kv head h // group in place
    # (5-10% faster per call on CPU in bf16 than expanding the kv heads, float32 the same).
    output = F.scaled_dot_product_attention(
        query.transpose(0, 1)[None],
        key.transpose(0, 1)[None],
        value.transpose(0, 1)[None],
        attn_mask=mask,
        is_causal=context_len == 0,
        scale=scale,
        enable_gqa=True,
    )
    return output[0].transpose(0, 1)
