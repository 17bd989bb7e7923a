"""pagedllm's fast ops: each runs pagedllm._C's kernel where it applies, else its torch code.

This is the one place that decides. A kernel applies when the extension is built and the
tensors are CPU float32 (or bfloat16 where the kernel has that variant) without autograd
(plus an op's own limits, such as head sizes for attention); the op then adapts the layout
the kernel needs (contiguous, int32 tables) and calls it through `_cpu_kernels`, the checked
boundary to the C code. Everywhere else (GPUs, other dtypes, no compiler at install) it runs
the torch definition in `_torch_ops`, which is also the reference the kernels are tested
against. Layers call these functions and never ask which path ran.
"""

import enum

import torch

from pagedllm import _cpu_kernels, _torch_ops, _torch_quant

_GGUF_KERNEL_TYPES = frozenset(int(t) for t in _cpu_kernels.GGUF_TYPES)


def has_cpu_kernels() -> bool:
    return _cpu_kernels.available()


_FLOAT32 = (torch.float32,)
_FLOAT32_OR_BF16 = (torch.float32, torch.bfloat16)


def cpu_kernels_apply(
    *tensors: torch.Tensor | None, dtypes: tuple[torch.dtype, ...] = _FLOAT32
) -> bool:
    """True when pagedllm._C can take these tensors: CPU, of one of `dtypes`, no autograd.

    Called for every layer of every step, so it is a plain loop."""
    if not _cpu_kernels.available():
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if t is not None and (not t.is_cpu or t.dtype not in dtypes or (grad and t.requires_grad)):
            return False
    return True


def _one_float_dtype(x: torch.Tensor) -> tuple[torch.dtype, ...]:
    """The `dtypes` of cpu_kernels_apply for an op whose tensors all share x's dtype, float32
    or bfloat16 (its kernel takes either, not a mix)."""
    return (x.dtype,) if x.dtype in _FLOAT32_OR_BF16 else ()


def _as_dense(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x as a contiguous tensor of dtype; the runner's index tensors already are, and are
    passed as they are (a no-op .to().contiguous() still costs microseconds per layer)."""
    return x if x.dtype is dtype and x.is_contiguous() else x.to(dtype).contiguous()


def _with_dense_rows(x: torch.Tensor) -> torch.Tensor:
    """x [T, ...] whose rows x[t] are each one dense block: a column slice of a fused qkv
    projection is kept as it is, anything else is copied."""
    return x if _cpu_kernels.rows_dense(x) else x.contiguous()


def prepack_linear_weight(weight: torch.Tensor) -> torch.Tensor:
    """A CPU weight [N, K] in the layout its kernel streams fastest, packed once at load:
    bfloat16 in AMX tiles (`_cpu_kernels.amx_pack_bf16`, [N / 16, K / 32, 16, 32]) where the
    CPU has them and N % 16 == 0, K % 32 == 0; else, where the best skinny_gemm build reads
    a packed order for the weight's dtype (`_cpu_kernels.skinny_gemm_reads_packed`: bfloat16
    in the avx512_bf16 build, float32 in the avx2 one) and the weight is whole blocks of it,
    that order (`_cpu_kernels.skinny_pack`); else `weight` itself. linear() takes any of
    them, skinny_pack's with the plain weight's bits.

    The rule: a packed order lays each tile's weight rows out as one stream, where a plain
    weight's are several streams K values apart that the CPU's prefetchers follow worse
    (the avx512_bf16 build runs 1.25-1.5x faster at 1 row on it), and spares the avx2 build
    transposing its panels of 16 weight rows on every call (1.6x at 1 row). AMX tiles match
    skinny_gemm_bf16 at 1-4 rows, where both read at the memory's bandwidth, and outrun it
    and oneDNN's F.linear from 16 rows. BENCHMARKS.md has the figures; `pagedllm bench
    linear --dtype bfloat16` (or `--isa avx2`) re-measures skinny_gemm against F.linear."""
    if not has_cpu_kernels() or not weight.is_cpu or weight.dim() != 2 or weight.requires_grad:
        return weight
    n, k = weight.shape
    bf16 = weight.dtype is torch.bfloat16
    if bf16 and _cpu_kernels.amx_available() and n % 16 == 0 and k % 32 == 0:
        return _cpu_kernels.amx_pack_bf16(weight.detach().contiguous())
    if _cpu_kernels.skinny_packable(weight) and _cpu_kernels.skinny_gemm_reads_packed(weight.dtype):
        return _cpu_kernels.skinny_pack(weight.detach().contiguous())
    return weight


class LinearKernel(enum.Enum):
    """What multiplies an unquantized weight, chosen once at load (select_linear_kernel) and
    kept on the layer (`layer.linear_kernel`), so what runs is decided there, not per call."""

    AMX = "amx_gemm_bf16"
    """bf16 weights in AMX tiles (prepack_linear_weight on a CPU with AMX)."""
    SKINNY = "skinny_gemm"
    """float32 or bf16 CPU weights, plain or in skinny_pack's order: the best build."""
    TORCH = "torch"
    """_torch_ops.linear: GPUs, float16, no extension (row by row in batch-invariant mode)."""


def select_linear_kernel(weight: torch.Tensor) -> LinearKernel:
    """The kernel for a weight as prepack_linear_weight left it, multiplied by activations
    of its own dtype."""
    if weight.dim() == 4 and weight.shape[2] == 16:
        return LinearKernel.AMX
    if cpu_kernels_apply(weight, dtypes=_FLOAT32_OR_BF16):
        return LinearKernel.SKINNY
    return LinearKernel.TORCH


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    packed_weight: torch.Tensor | None = None,
    kernel: LinearKernel | None = None,
) -> torch.Tensor:
    """F.linear(x, weight, bias): [..., K] x [N, K] -> [..., N], float32 or bfloat16; weight
    may be prepack_linear_weight's. packed_weight, where given (a tied LM head's copy), is
    prepack_linear_weight(weight), multiplied instead of weight. kernel: the layer's
    select_linear_kernel, run as chosen (its wrapper raises ValueError on tensors it cannot
    take); None (a weight outside a layer, such as an expert's slice) chooses here, and takes
    torch's path for activations the kernel cannot take.

    Every row count runs one kernel on a weight, skinny_gemm's best build or AMX tiles, and
    each sums every output in one order whatever M is: a row's result does not depend on the
    rows beside it, their number or their values (the batch, how a prompt is chunked, how
    much of it the prefix cache held). Where no kernel applies (GPUs, float16, autograd, no
    extension), F.linear, whose bits may change with M."""
    if packed_weight is not None:
        weight = packed_weight
    if kernel is None:
        kernel = select_linear_kernel(weight)
        dtypes = _one_float_dtype(x)
        if kernel is LinearKernel.SKINNY and not cpu_kernels_apply(x, weight, bias, dtypes=dtypes):
            kernel = LinearKernel.TORCH
    if kernel is LinearKernel.AMX:
        return _amx_linear(x, weight, bias)
    if kernel is LinearKernel.SKINNY:
        return _skinny_linear(x, weight, bias)
    return _torch_ops.linear(x, weight, bias)


def _skinny_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    gemm = _cpu_kernels.skinny_gemm_bf16 if x.dtype is torch.bfloat16 else _cpu_kernels.skinny_gemm
    k = x.shape[-1]
    x2 = (x if x.dim() == 2 else x.reshape(-1, k)).contiguous()
    bias = None if bias is None else bias.contiguous()
    y = gemm(x2, weight.contiguous(), bias)
    return y if x.dim() == 2 else y.view(*x.shape[:-1], y.shape[1])


def _amx_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    k = x.shape[-1]
    x2 = x.reshape(-1, k).to(torch.bfloat16).contiguous()
    bias = None if bias is None else bias.to(torch.bfloat16).contiguous()
    y = _cpu_kernels.amx_gemm_bf16(x2, packed, bias)
    return y.view(*x.shape[:-1], y.shape[-1])


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., n] * rsqrt(mean(x^2) + eps) * weight [n]."""
    if cpu_kernels_apply(x, weight, dtypes=_one_float_dtype(x)):
        return _cpu_kernels.rms_norm(_with_dense_rows(x), weight.contiguous(), eps)
    return _torch_ops.rms_norm(x, weight, eps)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual); the kernel does both in one pass."""
    if cpu_kernels_apply(x, residual, weight, dtypes=_one_float_dtype(x)):
        return _cpu_kernels.fused_add_rms_norm(
            x.contiguous(), residual.contiguous(), weight.contiguous(), eps
        )
    return _torch_ops.fused_add_rms_norm(x, residual, weight, eps)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [..., 2d] -> silu(x[..., :d]) * x[..., d:]."""
    if cpu_kernels_apply(x, dtypes=_one_float_dtype(x)):
        return _cpu_kernels.silu_and_mul(x.contiguous())
    return _torch_ops.silu_and_mul(x)


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
    every position (the kernel raises ValueError, torch IndexError, if not). query and key
    share a dtype; the cache is float32."""
    if not (
        query.dim() == key.dim() == 2
        and cpu_kernels_apply(query, key, dtypes=_one_float_dtype(query))
        and cpu_kernels_apply(cos_sin_cache)
    ):
        return _torch_ops.rotary_embedding(
            positions, query, key, head_size, cos_sin_cache, is_neox_style
        )
    return _cpu_kernels.rotary_embedding(
        _as_dense(positions, torch.int64),
        _with_dense_rows(query),
        _with_dense_rows(key),
        head_size,
        cos_sin_cache.contiguous(),
        is_neox_style,
    )


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Stores key/value [T, KV, D] (rows may be strided) in the caches [num_blocks,
    block_size, KV, D] at slot_mapping [T] (slot = block_id * block_size + offset), converted
    to the caches' dtype. The kernel also skips slots of -1 (padding rows of a captured decode
    step, executor/cpu_graph.py); the torch path takes real slots only."""
    if not cpu_kernels_apply(key, value, k_cache, v_cache, dtypes=_FLOAT32_OR_BF16):
        _torch_ops.reshape_and_cache(key, value, k_cache, v_cache, slot_mapping)
        return
    reshape_and_cache_kernel(key, value, k_cache, v_cache, slot_mapping)


def reshape_and_cache_kernel(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """reshape_and_cache on pagedllm._C alone, for a caller that chose the kernel (the CPU
    attention backend); _cpu_kernels raises ValueError on tensors it cannot take."""
    _cpu_kernels.reshape_and_cache(
        _with_dense_rows(key),
        _with_dense_rows(value),
        k_cache,
        v_cache,
        _as_dense(slot_mapping, torch.int64),
    )


def paged_decode_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    scale: float,
) -> torch.Tensor:
    """query [B, H, D], one new token per sequence; caches [num_blocks, block_size, KV, D];
    block_tables [B, max_blocks] and seq_lens [B] -> [B, H, D]. The kernel reads the cache in
    place; max_seq_len (the host-side max of seq_lens) sizes the torch path's padded gather.
    The caches may hold another dtype than the query (kv_cache_dtype); the output has the
    query's. The kernel computes in float32."""
    if not cpu_kernels_apply(query, k_cache, v_cache, dtypes=_FLOAT32_OR_BF16):
        return _torch_ops.paged_decode_attention(
            query, k_cache, v_cache, block_tables, seq_lens, max_seq_len, scale
        )
    return paged_decode_attention_kernel(
        query, k_cache, v_cache, block_tables, seq_lens, max_seq_len, scale
    )


def paged_decode_attention_kernel(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    scale: float,
) -> torch.Tensor:
    """paged_decode_attention on pagedllm._C alone (see reshape_and_cache_kernel)."""
    out = _cpu_kernels.paged_decode_attention(
        _as_float32(query.contiguous()),
        k_cache,
        v_cache,
        _as_dense(block_tables, torch.int32),
        _as_dense(seq_lens, torch.int32),
        scale,
    )
    return out if query.dtype is torch.float32 else _cpu_kernels.convert(out, query.dtype)


def prefill_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_len: int,
    scale: float,
) -> torch.Tensor:
    """query [n, H, D] at positions seq_len - n .. seq_len - 1 of one sequence, whose keys
    and values are in the caches through block_table -> [n, H, D], causal.

    On CPU float32 or bf16 tensors (any head size, a float32 or bf16 cache): pagedllm._C's
    float32 kernel (csrc/prefill_attention_f32.c), bf16 queries widened and the output
    rounded back as paged_decode_attention does. Row i is the bits paged_decode_attention
    gives its query as a sequence of seq_len - n + i + 1 tokens, so a token's output does
    not depend on whether it is decoded, recomputed alone after a prefix-cache hit, or
    prefilled in a chunk of any size. Recipes that cannot give decode's bits are not much
    faster: this kernel takes 0.7-1.3x the time of outer products summing each score in one
    FMA chain over D, and a bf16 chunk 1.4-1.6x that of AVX-512 BF16 dot products on weights
    rounded to bf16. BENCHMARKS.md has the figures; `pagedllm bench latency --input-len 512`
    times prefill (time to first token).
    Elsewhere the torch definition (sdpa).
    """
    if not cpu_kernels_apply(query, k_cache, v_cache, dtypes=_FLOAT32_OR_BF16):
        return _torch_ops.prefill_attention(query, k_cache, v_cache, block_table, seq_len, scale)
    return prefill_attention_kernel(query, k_cache, v_cache, block_table, seq_len, scale)


def prefill_attention_kernel(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_len: int,
    scale: float,
) -> torch.Tensor:
    """prefill_attention on pagedllm._C alone (see reshape_and_cache_kernel)."""
    out = _cpu_kernels.prefill_attention_f32(
        _as_float32(query.contiguous()),
        k_cache,
        v_cache,
        _as_dense(block_table, torch.int32),
        seq_len,
        scale,
    )
    return out if query.dtype is torch.float32 else _cpu_kernels.convert(out, query.dtype)


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """logits [rows, n].argmax(dim=-1), the greedy tokens: pagedllm._C's kernel for
    contiguous CPU float32 or bfloat16 rows, 4.5-5x faster than torch.argmax's walk element
    by element (csrc/argmax.c)."""
    if (
        logits.dim() == 2
        and logits.shape[1] > 0
        and logits.is_contiguous()
        and cpu_kernels_apply(logits, dtypes=_FLOAT32_OR_BF16)
    ):
        return _cpu_kernels.argmax(logits)
    return logits.argmax(dim=-1)


def _as_float32(x: torch.Tensor) -> torch.Tensor:
    """A contiguous float32 or bfloat16 x in float32, converted by the kernel (a launch that
    record_launches sees, unlike torch's .to)."""
    return x if x.dtype is torch.float32 else _cpu_kernels.convert(x, torch.float32)


def _gguf_kernels_apply(qweight: torch.Tensor, qtype: int) -> bool:
    """pagedllm._C can read qweight: a CPU uint8 tensor [..., bytes] of a type it knows."""
    return (
        _cpu_kernels.available()
        and qweight.is_cpu
        and qweight.dtype == torch.uint8
        and qweight.dim() > 0
        and int(qtype) in _GGUF_KERNEL_TYPES
    )


def gguf_pack(qweight: torch.Tensor, qtype: int) -> torch.Tensor | None:
    """The GGUF blocks qweight [..., N, K / block_size * type_size] of qtype in the layout
    gguf_packed_linear multiplies ([..., groups of 16 rows, bytes]: csrc/gguf_packed.h), where
    pagedllm._C runs them (a CPU weight); None elsewhere, where the blocks stay and
    gguf_linear multiplies them in torch. Called once per weight at load."""
    if qweight.dim() < 2 or not _gguf_kernels_apply(qweight, qtype):
        return None
    if qweight.dim() == 2:
        return _cpu_kernels.gguf_pack(qweight.detach().contiguous(), int(qtype))
    matrices = qweight.detach().reshape(-1, *qweight.shape[-2:]).contiguous()
    n, k = _cpu_kernels.gguf_weight_shape(matrices[0], int(qtype))
    packed = torch.empty(
        len(matrices), *_cpu_kernels.gguf_packed_shape(qtype, n, k), dtype=torch.uint8
    )
    for w, out in zip(matrices, packed, strict=True):
        _cpu_kernels.gguf_pack(w, int(qtype), out=out)
    return packed.view(*qweight.shape[:-2], *packed.shape[1:])


def gguf_packed_linear(
    x: torch.Tensor,
    packed: torch.Tensor,
    qtype: int,
    n: int,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [..., K] @ W^T (+ bias [N]) -> [..., N] for W [N, K] the GGUF weight gguf_pack made
    `packed` of: pagedllm._C's gguf_mm for CPU float32 or bfloat16 x (each row quantized to
    8-bit blocks, its result the same bits whatever the other rows: csrc/gguf_packed.h);
    otherwise W unpacked to float32 and F.linear."""
    k = x.shape[-1]
    dtypes = _one_float_dtype(x)
    if not cpu_kernels_apply(x, bias, dtypes=dtypes) or (
        bias is not None and bias.dtype != x.dtype
    ):
        rows = torch.arange(n, dtype=torch.int64)
        w = _cpu_kernels.gguf_unpack_rows(packed, int(qtype), n, k, rows)
        return _torch_ops.linear(x, w.to(x.dtype), bias)
    x2 = (x if x.dim() == 2 else x.reshape(-1, k)).contiguous()
    bias = None if bias is None else bias.contiguous()
    y = _cpu_kernels.gguf_mm(x2, packed, int(qtype), n, bias)
    return y if x.dim() == 2 else y.view(*x.shape[:-1], n)


def gguf_packed_embedding(
    input_ids: torch.Tensor, packed: torch.Tensor, qtype: int, n: int, k: int
) -> torch.Tensor:
    """Rows input_ids [...] of the GGUF table [n, k] gguf_pack made `packed` of -> float32
    [..., k], bit-equal to gguf.quants.dequantize of their blocks."""
    ids = _as_dense(input_ids.reshape(-1), torch.int64)
    w = _cpu_kernels.gguf_unpack_rows(packed, int(qtype), n, k, ids)
    return w.view(*input_ids.shape, k)


def gguf_linear(
    x: torch.Tensor, qweight: torch.Tensor, qtype: int, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x [..., K] @ W^T (+ bias [N]) -> [..., N], W [N, K] being the GGUF blocks qweight
    [N, K / block_size * type_size] of qtype as stored (weights gguf_pack leaves as they are:
    GPUs, no extension): dequantized and multiplied in torch (_torch_ops.linear, so row by row
    in batch-invariant mode)."""
    return _torch_ops.linear(x, _torch_quant.dequantize(qweight, qtype).to(x.dtype), bias)


def gguf_dequantize(qweight: torch.Tensor, qtype: int) -> torch.Tensor:
    """qweight uint8 [..., K / block_size * type_size] of qtype -> float32 [..., K],
    bit-equal to gguf.quants.dequantize."""
    if not _gguf_kernels_apply(qweight, qtype):
        return _torch_quant.dequantize(qweight, qtype)
    rows = qweight.reshape(-1, qweight.shape[-1]).contiguous()
    w = _cpu_kernels.gguf_dequantize(rows, qtype)
    return w.view(*qweight.shape[:-1], w.shape[1])


def gguf_embedding(input_ids: torch.Tensor, qweight: torch.Tensor, qtype: int) -> torch.Tensor:
    """Rows input_ids [...] of the GGUF table qweight [V, bytes] -> float32 [..., K]; only
    the looked-up rows are dequantized."""
    w = gguf_dequantize(qweight.index_select(0, input_ids.reshape(-1)), qtype)
    return w.view(*input_ids.shape, w.shape[-1])
