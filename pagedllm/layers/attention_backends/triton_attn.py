"""The Triton attention backend (vLLM's TRITON_ATTN): pagedllm/_triton_ops' kernels.

The cache write is one kernel, and a step's whole batch, decodes and prefill chunks with
their cached context alike, is one unified attention launch (plus a reduce when long
decodes split their context), planned from host ints alone: no per-sequence Python loop,
no gathered copy of the keys, nothing that waits on the device.

It runs on CUDA (Triton ships with torch's CUDA wheels) in float32, bfloat16 and float16;
on CPU tensors only under Triton's interpreter (TRITON_INTERPRET=1), where the selector
takes it only when asked by name: the interpreter is for tests, not speed.
"""

import torch

from pagedllm import _triton_ops
from pagedllm.forward_context import AttentionMetadata
from pagedllm.layers.attention_backends.backend import AttentionCGSupport

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class TritonAttentionBackend:
    name = "TRITON_ATTN"
    requirement = (
        "triton installed and float32, bfloat16 or float16 on CUDA, or on CPU tensors under "
        f"Triton's interpreter ({_triton_ops.INTERPRET_ENV}=1 before triton is imported)"
    )
    reads_fp8_kv_cache = True
    # The launch takes lengths from the metadata's device tensors; its host ints only size
    # the grid (max_seq_len, at capture max_model_len, is an upper bound), so a captured
    # decode step replays correctly for any lengths.
    cudagraph_support = AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE

    @staticmethod
    def supports(device: torch.device, dtype: torch.dtype) -> bool:
        if dtype not in DTYPES or not _triton_ops.has_triton():
            return False
        if device.type == "cpu":
            return _triton_ops.interpreting()
        return device.type == "cuda"

    def write_kv(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        from pagedllm._triton_ops.cache_write import reshape_and_cache

        reshape_and_cache(key, value, k_cache, v_cache, slot_mapping)

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
        from pagedllm._triton_ops.unified_attention import unified_attention

        md = attn_metadata
        return unified_attention(
            query,
            k_cache,
            v_cache,
            md.query_start_loc,
            md.seq_lens,
            md.block_tables,
            md.max_query_len,
            md.max_seq_len,
            scale,
            sliding_window,
            logits_soft_cap=logits_soft_cap,
        )
