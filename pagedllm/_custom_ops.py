"""CPU kernels from pagedllm._C, each with the torch code it replaces as the fallback.

pagedllm._C is built from csrc/ at install time (setup.py). It is optional: where it is
missing (no compiler), or an input is not contiguous-enough float32 on the CPU, callers
take their torch path, which stays the reference the kernels are tested against.
"""

import torch
import torch.nn.functional as F

try:
    from pagedllm import _C
except ImportError:
    _C = None

SKINNY_GEMM_MAX_ROWS = 256 if _C is not None and _C.cpu_has_avx512() else 4
"""Up to this many rows of x, linear() uses pagedllm._C's skinny_gemm. On the AVX-512
development machine it beat MKL from 1 row (2.5-4x, bandwidth bound) to 256 rows (1.1-2x)
and lost from ~512; on AVX2 its 4 x 4 register tile spills, so only the bandwidth-bound
few-row case takes it there."""


def has_cpu_kernels() -> bool:
    return _C is not None


def cpu_kernels_apply(*tensors: torch.Tensor | None) -> bool:
    """True when pagedllm._C can take these tensors: CPU, float32, no autograd.

    Called for every layer of every step, so it is a plain loop."""
    if _C is None:
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if t is not None and (
            not t.is_cpu or t.dtype != torch.float32 or (grad and t.requires_grad)
        ):
            return False
    return True


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias): [..., K] x [N, K] -> [..., N]."""
    few_rows = x.numel() <= SKINNY_GEMM_MAX_ROWS * x.shape[-1]
    if not (few_rows and weight.dim() == 2 and cpu_kernels_apply(x, weight, bias)):
        return F.linear(x, weight, bias)
    n, k = weight.shape
    x2 = (x if x.dim() == 2 else x.reshape(-1, k)).contiguous()
    bias_ptr = 0 if bias is None else bias.contiguous().data_ptr()
    y = torch.empty(x2.shape[0], n)
    _C.skinny_gemm(
        x2.data_ptr(), weight.contiguous().data_ptr(), bias_ptr, y.data_ptr(),
        x2.shape[0], n, k, torch.get_num_threads(),
    )  # fmt: skip
    return y if x.dim() == 2 else y.view(*x.shape[:-1], n)


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Stores key/value [T, KV, D] (rows may be strided) in the caches [num_blocks,
    block_size, KV, D] at slot_mapping [T] (slot = block_id * block_size + offset)."""
    assert k_cache.is_contiguous() and v_cache.is_contiguous()
    key, value = _dense_rows(key), _dense_rows(value)
    slot_mapping = slot_mapping.to(torch.int64).contiguous()
    _C.reshape_and_cache(
        key.data_ptr(), value.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(),
        slot_mapping.data_ptr(), key.shape[0], key.stride(0), value.stride(0),
        key.shape[1] * key.shape[2],
    )  # fmt: skip


def _dense_rows(x: torch.Tensor) -> torch.Tensor:
    """x [T, A, B] whose rows x[t] are each one dense block (the row stride may be larger)."""
    dense = x.stride(2) == 1 and x.stride(1) == x.shape[2]
    return x if dense else x.contiguous()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., n] * rsqrt(mean(x^2) + eps) * weight [n]."""
    x = x.contiguous()
    out = torch.empty_like(x)
    n = x.shape[-1]
    _C.rms_norm(
        out.data_ptr(), x.data_ptr(), weight.contiguous().data_ptr(),
        x.numel() // n, n, torch.get_num_threads(), eps,
    )  # fmt: skip
    return out


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual), in one pass."""
    x, residual = x.contiguous(), residual.contiguous()
    out, residual_out = torch.empty_like(x), torch.empty_like(x)
    n = x.shape[-1]
    _C.fused_add_rms_norm(
        out.data_ptr(), residual_out.data_ptr(), x.data_ptr(), residual.data_ptr(),
        weight.contiguous().data_ptr(), x.numel() // n, n, torch.get_num_threads(), eps,
    )  # fmt: skip
    return out, residual_out


def rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox_style: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """query [T, H * head_size] and key [T, KV * head_size], rotated; their rows may be
    strided (column slices of a fused qkv). cos_sin_cache [max_pos, rotary_dim] must cover
    every position (the caller checks)."""
    query = query if query.stride(-1) == 1 else query.contiguous()
    key = key if key.stride(-1) == 1 else key.contiguous()
    positions = positions.to(torch.int64).contiguous()
    query_out, key_out = torch.empty(query.shape), torch.empty(key.shape)
    _C.rotary_embedding(
        positions.data_ptr(), query.data_ptr(), key.data_ptr(), query_out.data_ptr(),
        key_out.data_ptr(), query.stride(0), key.stride(0), query.shape[0],
        query.shape[1] // head_size, key.shape[1] // head_size, head_size,
        cos_sin_cache.shape[1], cos_sin_cache.contiguous().data_ptr(), int(is_neox_style),
        torch.get_num_threads(),
    )  # fmt: skip
    return query_out, key_out


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [..., 2d] -> silu(x[..., :d]) * x[..., d:]."""
    x = x.contiguous()
    d = x.shape[-1] // 2
    out = torch.empty(*x.shape[:-1], d, dtype=x.dtype)
    _C.silu_and_mul(out.data_ptr(), x.data_ptr(), x.numel() // (2 * d), d, torch.get_num_threads())
    return out


def paged_decode_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """query [B, H, D], one new token per sequence; caches [num_blocks, block_size, KV, D];
    block_tables [B, max_blocks] and seq_lens [B] -> [B, H, D], read from the cache in place."""
    num_seqs, num_heads, head_size = query.shape
    block_size, num_kv_heads = k_cache.shape[1:3]
    assert k_cache.is_contiguous() and v_cache.is_contiguous()
    query = query.contiguous()
    block_tables = block_tables.to(torch.int32).contiguous()
    seq_lens = seq_lens.to(torch.int32).contiguous()
    output = torch.empty_like(query)
    _C.paged_decode_attention(
        output.data_ptr(), query.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(),
        block_tables.data_ptr(), seq_lens.data_ptr(), num_seqs, num_heads, num_kv_heads,
        head_size, block_size, block_tables.shape[1], torch.get_num_threads(), scale,
    )  # fmt: skip
    return output
