"""Kernels with a faster path than stock ATen on some inputs; torch is the fallback.

pagedllm._C is built from csrc/ at install time (setup.py). It is optional: where it is
missing (no compiler) or the input is not what it handles, these functions call torch.
"""

import torch
import torch.nn.functional as F

try:
    from pagedllm import _C
except ImportError:
    _C = None

GEMV_MAX_ROWS = 4
"""Up to this many rows of x, linear() streams the weight once through pagedllm._C;
beyond it the product is compute bound and MKL's GEMM wins."""


def has_cpu_gemv() -> bool:
    return _C is not None


def _gemv_applies(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    return (
        _C is not None
        and x.device.type == "cpu"
        and x.dtype == weight.dtype == torch.float32
        and x.numel() <= GEMV_MAX_ROWS * x.shape[-1]
        and weight.dim() == 2
        and weight.is_contiguous()
        and (bias is None or (bias.dtype == torch.float32 and bias.is_contiguous()))
        and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
    )


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias): [..., K] x [N, K] -> [..., N]."""
    if not _gemv_applies(x, weight, bias):
        return F.linear(x, weight, bias)
    n, k = weight.shape
    x2 = x.reshape(-1, k).contiguous()
    y = torch.empty(x2.shape[0], n, dtype=x.dtype)
    bias_ptr = 0 if bias is None else bias.data_ptr()
    _C.gemv(
        x2.data_ptr(),
        weight.data_ptr(),
        bias_ptr,
        y.data_ptr(),
        x2.shape[0],
        n,
        k,
        torch.get_num_threads(),
    )
    return y.view(*x.shape[:-1], n)


def paged_decode_applies(query: torch.Tensor, k_cache: torch.Tensor) -> bool:
    return (
        _C is not None
        and query.device.type == "cpu"
        and query.dtype == k_cache.dtype == torch.float32
        and k_cache.is_contiguous()
    )


def paged_decode_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """query [B, H, D], one new token per sequence; caches [num_blocks, block_size, KV, D];
    block_tables [B, max_blocks] and seq_lens [B] int32 -> [B, H, D]. Reads the cache in
    place; only for inputs where paged_decode_applies()."""
    num_seqs, num_heads, head_size = query.shape
    block_size, num_kv_heads = k_cache.shape[1:3]
    query = query.contiguous()
    block_tables = block_tables.to(torch.int32).contiguous()
    seq_lens = seq_lens.to(torch.int32).contiguous()
    output = torch.empty_like(query)
    _C.paged_decode_attention(
        output.data_ptr(),
        query.data_ptr(),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        block_tables.data_ptr(),
        seq_lens.data_ptr(),
        num_seqs,
        num_heads,
        num_kv_heads,
        head_size,
        block_size,
        block_tables.shape[1],
        torch.get_num_threads(),
        scale,
    )
    return output
