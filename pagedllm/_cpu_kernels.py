"""pagedllm._C's kernels as functions of tensors: the checked boundary to the C code.

The C functions take raw data pointers and sizes, so a wrong tensor there (another dtype, a
strided view, swapped arguments) reads or writes arbitrary memory. Every call into
pagedllm._C goes through this module, the only one to import it. Each function checks every
tensor's type, dtype, device, layout and shape and raises ValueError naming the argument;
then it takes every size from the checked tensors (callers pass none) and allocates the
outputs, so pointers and sizes cannot disagree. Index values (cache slots, block ids,
positions) are checked by csrc/module.c, which reads them anyway.

The checks are attribute reads only, no tensor ops: they run ~300 times per decode step.
Callers (`_custom_ops`) pick the kernel only when `available()`; _C is None without the
extension.

Every kernel call is a launch: a kernel and its arguments, all ints and floats. Within
`record_launches()` this thread's launches are also listed, and `replay_launches` runs such a
list again: the same kernels on the same memory, without the Python that produced them
(executor/cpu_graph.py captures decode steps that way).
"""

import math
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

try:
    from pagedllm import _C
except ImportError:
    _C = None

_F32, _BF16, _I32, _I64, _U8 = torch.float32, torch.bfloat16, torch.int32, torch.int64, torch.uint8
_CACHE = "[num_blocks, block_size, num_kv_heads, head_dim]"
_ANY_DIMS = -1  # a `shape` for _check: one dimension or more, any sizes


def available() -> bool:
    return _C is not None


Launch = tuple[Callable[..., None], tuple[int | float, ...]]


class _Recording(threading.local):
    launches: list[Launch] | None = None


_recording = _Recording()


def _launch(kernel: Callable[..., None], *args: int | float) -> None:
    launches = _recording.launches
    if launches is not None:
        launches.append((kernel, args))
    kernel(*args)


@contextmanager
def record_launches() -> Iterator[list[Launch]]:
    """Yields a list to which this thread's kernel launches are appended until the block
    ends (they still run). Not nested."""
    if _recording.launches is not None:
        raise RuntimeError("record_launches() is already active in this thread")
    _recording.launches = launches = []
    try:
        yield launches
    finally:
        _recording.launches = None


def replay_launches(launches: list[Launch]) -> None:
    """Runs recorded launches again, in order. Their pointers must still be valid: the caller
    keeps every tensor they point into alive. The bindings' index checks run as before."""
    for kernel, args in launches:
        kernel(*args)


_Q = GGMLQuantizationType
GGUF_TYPES = (_Q.Q4_0, _Q.Q4_1, _Q.Q5_0, _Q.Q5_1, _Q.Q8_0, _Q.Q4_K, _Q.Q5_K, _Q.Q6_K)
"""The GGUF block types gguf_pack, gguf_mm and gguf_dequantize take (csrc/gguf.h)."""
_GGUF_SIZES = {int(t): GGML_QUANT_SIZES[t] for t in GGUF_TYPES}  # (block_size, type_size)
_GGUF_ISAS: tuple[tuple[str, bool], ...] = _C.gguf_isas() if _C is not None else ()
_ATTENTION_ISAS: tuple[tuple[str, bool], ...] = _C.paged_attention_isas() if _C is not None else ()
_SKINNY_ISAS: tuple[tuple[str, bool], ...] = _C.skinny_gemm_isas() if _C is not None else ()
_PREFILL_F32_ISAS: tuple[tuple[str, bool], ...] = (
    _C.prefill_attention_f32_isas() if _C is not None else ()
)


def _supported(table: tuple[tuple[str, bool], ...]) -> tuple[str, ...]:
    return tuple(name for name, supported in table if supported)


def gguf_isas() -> tuple[str, ...]:
    """The instruction sets gguf_mm can use on this CPU, best first (empty without _C)."""
    return _supported(_GGUF_ISAS)


def skinny_gemm_isas() -> tuple[str, ...]:
    """The builds of skinny_gemm this CPU runs, best first (empty without _C)."""
    return _supported(_SKINNY_ISAS)


def skinny_gemm_reads_packed(dtype: torch.dtype, isa: str | None = None) -> bool:
    """Whether that build of skinny_gemm (the best for None) reads weights of dtype (float32
    or bfloat16) in skinny_pack's order (False without _C)."""
    if _C is None:
        return False
    isa_index = _isa_index("skinny_gemm_reads_packed", isa, _SKINNY_ISAS)
    return _C.skinny_gemm_reads_packed(isa_index, dtype is _BF16)


def paged_attention_isas() -> tuple[str, ...]:
    """The builds of paged_decode_attention this CPU runs, best first (empty without _C)."""
    return _supported(_ATTENTION_ISAS)


def prefill_attention_f32_isas() -> tuple[str, ...]:
    """The builds of prefill_attention_f32 this CPU runs, best first (empty without _C)."""
    return _supported(_PREFILL_F32_ISAS)


def _isa_index(op: str, isa: str | None, table: tuple[tuple[str, bool], ...]) -> int:
    """The kernel's index of isa, a name its table marks supported; -1 (the best) for None."""
    if isa is None:
        return -1
    supported = _supported(table)
    _require(op, isa in supported, "isa {!r} is not one of this CPU's {}", isa, supported)
    return [name for name, _ in table].index(isa)


def rows_dense(t: torch.Tensor) -> bool:
    """Each row t[i] of a tensor of 1 or more dimensions is one dense block; rows may be
    further apart (column slices of a fused qkv projection, their per-head views)."""
    stride, shape = t.stride(), t.shape
    if not stride or stride[-1] != 1:
        return False
    size = shape[-1]
    for i in range(len(shape) - 2, 0, -1):
        if shape[i] != 1 and stride[i] != size:
            return False
        size *= shape[i]
    return True


def _check(
    op: str,
    name: str,
    t: object,
    shape: int | tuple[int, ...],
    dims: str,
    dtype: torch.dtype = _F32,
    rows: bool = False,
) -> None:
    """t must be a CPU tensor of `dtype`, contiguous (or, with rows, dense row by row), of
    exactly `shape`, or of `shape` dimensions when it is an int (its sizes then set the
    others'; _ANY_DIMS: at least one). `dims` names the dimensions for the message."""
    if (
        isinstance(t, torch.Tensor)
        and t.dtype is dtype
        and t.is_cpu
        and (
            t.shape == shape
            if type(shape) is not int
            else t.dim() == shape or (shape == _ANY_DIMS and t.dim() > 0)
        )
        and (rows_dense(t) if rows else t.is_contiguous())
    ):
        return
    layout = "row-dense" if rows else "contiguous"
    sizes = "" if type(shape) is int else f" = {list(shape)}"
    raise ValueError(
        f"{op}: {name} must be a {layout} {str(dtype)[6:]} CPU tensor of shape {dims}{sizes}, "
        f"got {_describe(t)}"
    )


def _float_dtype(t: object) -> torch.dtype:
    """t's dtype when the kernel takes it (float32 or bfloat16), else float32, for _check to
    name in its error."""
    dtype = getattr(t, "dtype", None)
    return dtype if dtype is _BF16 else _F32


def _describe(t: object) -> str:
    if not isinstance(t, torch.Tensor):
        return f"{type(t).__name__} {t!r:.80}"
    layout = "contiguous" if t.is_contiguous() else f"strides {t.stride()}"
    return f"{str(t.dtype)[6:]} {t.device} tensor of shape {list(t.shape)} ({layout})"


def _require(op: str, ok: bool, message: str, *args: object) -> None:
    """Raises ValueError(op: message.format(*args)) unless ok; formats only then."""
    if not ok:
        raise ValueError(f"{op}: " + message.format(*args))


def skinny_gemm(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, isa: str | None = None
) -> torch.Tensor:
    """x [M, K] @ weight [N, K]^T (+ bias [N]) -> [M, N], float32; weight plain or in
    skinny_pack's panels [N / 16, K, 16] (read by the avx2 build only: ValueError elsewhere;
    the same bits as the plain weight's). Each output is summed in one order whatever M is.
    isa: one of skinny_gemm_isas(), or None for the best."""
    return _skinny_gemm("skinny_gemm", _F32, x, weight, bias, isa)


def skinny_gemm_bf16(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, isa: str | None = None
) -> torch.Tensor:
    """skinny_gemm on bfloat16 tensors (float32 products and sums) -> bfloat16 [M, N]; weight
    plain or in skinny_pack's tiles [N / 4, K / 32, 4, 32] (read by the avx512_bf16 build
    only). isa: as in skinny_gemm (the same builds)."""
    return _skinny_gemm("skinny_gemm_bf16", _BF16, x, weight, bias, isa)


SKINNY_PACKED = {_F32: (16, 8, "[N / 16, K, 16]"), _BF16: (4, 32, "[N / 4, K / 32, 4, 32]")}
"""Per dtype, the packed order skinny_gemm reads: N a multiple of the first number, K of the
second (csrc/ops.h's SKINNY_PANEL_ROWS and the avx2 build's lanes; SKINNY_PACK_ROWS and
SKINNY_PACK_K), and its shape."""


def skinny_packable(weight: torch.Tensor) -> bool:
    """Whether skinny_pack takes weight: [N, K] of a dtype in SKINNY_PACKED, whole blocks."""
    if weight.dim() != 2 or weight.dtype not in SKINNY_PACKED:
        return False
    (n, k), (rows, k_step, _) = weight.shape, SKINNY_PACKED[weight.dtype]
    return n > 0 and k > 0 and n % rows == 0 and k % k_step == 0


def skinny_pack(weight: torch.Tensor) -> torch.Tensor:
    """weight [N, K] -> the order in which the skinny_gemm builds that read it stream it front
    to back. float32: panels of 16 weight rows, each k's 16 values side by side, [N / 16, K,
    16] (the avx2 build's outer products). bfloat16: per 4 weight rows (one tile) and 32 of
    K (one dot-product step), the 4 rows' 32 values side by side, [N / 4, K / 32, 4, 32]
    (the avx512_bf16 build's). _torch_ops.unpack_skinny gives the weight back."""
    op, dtype = "skinny_pack", _float_dtype(weight)
    rows, k_step, _ = SKINNY_PACKED[dtype]
    _check(op, "weight", weight, 2, "[N, K]", dtype)
    _require(op, skinny_packable(weight), "weight [N, K] = {} needs N % {} == 0 and K % {} == 0",
             list(weight.shape), rows, k_step)  # fmt: skip
    n, k = weight.shape
    if dtype is _F32:
        return weight.view(n // rows, rows, k).transpose(1, 2).contiguous()
    return weight.view(n // rows, rows, k // k_step, k_step).transpose(1, 2).contiguous()


def amx_available() -> bool:
    """Whether amx_gemm_bf16 runs here: the CPU has AMX bf16 tiles and Linux granted them."""
    return _C is not None and _C.amx_gemm_supported()


def amx_pack_bf16(weight: torch.Tensor) -> torch.Tensor:
    """weight [N, K] bfloat16 (N % 16 == 0, K % 32 == 0) -> [N / 16, K / 32, 16, 32]: per
    16 output columns and 32 of K, the tile whose row r holds each column's elements 2r and
    2r + 1 (csrc/amx_gemm.c)."""
    op = "amx_pack_bf16"
    _check(op, "weight", weight, 2, "[N, K]", _BF16)
    n, k = weight.shape
    _require(op, n % 16 == 0 and k % 32 == 0 and n > 0 and k > 0,
             "weight [N, K] = [{}, {}] needs N % 16 == 0 and K % 32 == 0", n, k)  # fmt: skip
    packed = weight.new_empty(n // 16, k // 32, 16, 32)
    _launch(_C.amx_pack_bf16, packed.data_ptr(), weight.data_ptr(), n, k)
    return packed


def amx_gemm_bf16(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [M, K] @ weight^T (+ bias [N]) -> bfloat16 [M, N] on AMX tiles, for packed =
    amx_pack_bf16(weight); float32 sums, each row's the same bits whatever M is. Raises
    RuntimeError where not amx_available()."""
    op = "amx_gemm_bf16"
    n, k = _packed_size(op, "packed", packed, (16, 32), _AMX_PACKED)
    return _gemm(op, _BF16, x, packed, "packed weight", n, k, bias)


def _check_prefill(
    op: str,
    query: object,
    k_cache: object,
    v_cache: object,
    block_table: object,
    cache_dtype: torch.dtype,
) -> tuple[int, int, int, int, int, int]:
    """A prefill attention call's tensors checked -> (n, H, KV, D, num_blocks, block_size)."""
    _check(op, "query", query, 3, "[num_queries, num_heads, head_dim]")
    _check(op, "k_cache", k_cache, 4, _CACHE, cache_dtype)
    _check(op, "v_cache", v_cache, k_cache.shape, _CACHE + " like k_cache", cache_dtype)
    _check(op, "block_table", block_table, 1, "[max_blocks]", _I32)
    n, h, d = query.shape
    num_blocks, block_size, kv, cache_d = k_cache.shape
    _require(op, cache_d == d, "k_cache head_dim {} differs from query's {}", cache_d, d)
    _require(op, kv > 0 and h % kv == 0, "num_kv_heads {} must divide num_heads {}", kv, h)
    return n, h, kv, d, num_blocks, block_size


def prefill_attention_f32(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_len: int,
    scale: float,
    isa: str | None = None,
) -> torch.Tensor:
    """query [n, H, D] float32 at positions seq_len - n .. seq_len - 1 of one sequence;
    caches [num_blocks, block_size, KV, D] float32 or bfloat16; block_table [max_blocks]
    int32 -> float32 [n, H, D], causal: row i the bits paged_decode_attention gives its query
    as a sequence of seq_len - n + i + 1 tokens on the same build. isa: one of
    prefill_attention_f32_isas(), or None for the best."""
    op = "prefill_attention_f32"
    cache_dtype = _float_dtype(k_cache)
    n, h, kv, d, num_blocks, block_size = _check_prefill(
        op, query, k_cache, v_cache, block_table, cache_dtype
    )
    _require(op, d > 0, "head_dim {} must be positive", d)
    isa_index = _isa_index(op, isa, _PREFILL_F32_ISAS)
    out = torch.empty_like(query)
    _launch(
        _C.prefill_attention_f32, out.data_ptr(), query.data_ptr(), k_cache.data_ptr(),
        v_cache.data_ptr(), cache_dtype is _BF16, block_table.data_ptr(), n, seq_len, h, kv, d,
        block_size, block_table.shape[0], num_blocks, isa_index, torch.get_num_threads(), scale,
    )  # fmt: skip
    return out


_AMX_PACKED = "[N / 16, K / 32, 16, 32]"


def _packed_size(
    op: str, name: str, packed: object, tile: tuple[int, int], layout: str
) -> tuple[int, int]:
    """(N, K) of a bfloat16 weight packed in tiles of `tile` (rows, values of K): checked as
    a 4-D tensor whose last two dimensions are the tile's."""
    _check(op, name, packed, 4, layout, _BF16)
    blocks_n, blocks_k, rows, cols = packed.shape
    _require(op, (rows, cols) == tile and blocks_n > 0 and blocks_k > 0,
             "packed weight {} is not {}", tuple(packed.shape), layout)  # fmt: skip
    return blocks_n * rows, blocks_k * cols


def _skinny_gemm(
    op: str,
    dtype: torch.dtype,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    isa: str | None,
) -> torch.Tensor:
    """The checks and call of _C.<op>, whose tensors are all of `dtype`, on a weight plain
    [N, K] or in skinny_pack's order (for the builds that skinny_gemm_reads_packed)."""
    isa_index = _isa_index(op, isa, _SKINNY_ISAS)
    if not isinstance(weight, torch.Tensor) or weight.dim() == 2:
        _check(op, "weight", weight, 2, "[N, K]", dtype)
        return _gemm(op, dtype, x, weight, "weight [N, K]", *weight.shape, bias, 0, isa_index)
    n, k = _skinny_packed_size(op, dtype, weight)
    _require(
        op,
        _C.skinny_gemm_reads_packed(isa_index, dtype is _BF16),
        "build {!r} does not read packed weights (only the {} build does)",
        isa or skinny_gemm_isas()[0],
        "avx512_bf16" if dtype is _BF16 else "avx2",
    )
    return _gemm(op, dtype, x, weight, "packed weight", n, k, bias, 1, isa_index)


def _skinny_packed_size(op: str, dtype: torch.dtype, weight: torch.Tensor) -> tuple[int, int]:
    """(N, K) of a weight in skinny_pack's order for dtype, checked."""
    rows, k_step, layout = SKINNY_PACKED[dtype]
    if dtype is _BF16:
        return _packed_size(op, "weight", weight, (rows, k_step), layout)
    _check(op, "weight", weight, 3, layout, dtype)
    blocks, k, lanes = weight.shape
    _require(op, lanes == rows and blocks > 0 and k > 0 and k % k_step == 0,
             "packed weight {} is not {} with K % {} == 0", tuple(weight.shape), layout,
             k_step)  # fmt: skip
    return blocks * rows, k


def _gemm(
    op: str,
    dtype: torch.dtype,
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_name: str,
    n: int,
    weight_k: int,
    bias: torch.Tensor | None,
    *flags: int,
) -> torch.Tensor:
    """The checks of x and bias and the call of matmul kernel _C.<op> on a weight of n
    outputs and weight_k inputs, itself checked by the caller (flags: the kernel's int
    arguments between K and the thread count: skinny_gemm's packed and isa)."""
    _check(op, "x", x, 2, "[M, K]", dtype)
    m, k = x.shape
    _require(op, weight_k == k, "{} has K = {}, x [M, K] has K = {}", weight_name, weight_k, k)
    if bias is not None:
        _check(op, "bias", bias, (n,), "[N]", dtype)
    y = x.new_empty(m, n)
    bias_ptr = 0 if bias is None else bias.data_ptr()
    _launch(
        getattr(_C, op), x.data_ptr(), weight.data_ptr(), bias_ptr, y.data_ptr(), m, n, k, *flags,
        torch.get_num_threads(),
    )  # fmt: skip
    return y


def _check_norm_args(
    op: str, x: object, weight: object, rows: bool = False
) -> tuple[torch.dtype, int, int]:
    """x [..., n] (contiguous, or with rows dense row by row) and weight [n], both float32
    or both bfloat16 -> (dtype, rows, n)."""
    dtype = _float_dtype(x)
    _check(op, "x", x, _ANY_DIMS, "[..., n]", dtype, rows=rows)
    n = x.shape[-1]
    _check(op, "weight", weight, (n,), "[n], n = x's last dim", dtype)
    return dtype, (x.numel() // n if n else 0), n


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., n] * rsqrt(mean(x^2) + eps) * weight [n] -> a new contiguous tensor; in
    bfloat16 rounded as _torch_ops.rms_norm rounds. x's rows x[i] must each be one dense
    block, x[i] and x[i + 1] may be further apart (the per-head view [T, heads, n] of a fused
    qkv's column slice)."""
    dtype, rows, n = _check_norm_args("rms_norm", x, weight, rows=True)
    group = max(math.prod(x.shape[1:-1]), 1)  # norm rows per x[i], x.stride(0) apart
    out = torch.empty(x.shape, dtype=dtype)
    _launch(
        _C.rms_norm, out.data_ptr(), x.data_ptr(), weight.data_ptr(), dtype is _BF16, rows, n,
        group, x.stride(0), torch.get_num_threads(), eps,
    )  # fmt: skip
    return out


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual), in one pass."""
    op = "fused_add_rms_norm"
    dtype, rows, n = _check_norm_args(op, x, weight)
    _check(op, "residual", residual, x.shape, "[..., n] like x", dtype)
    out, residual_out = torch.empty_like(x), torch.empty_like(x)
    _launch(
        _C.fused_add_rms_norm, out.data_ptr(), residual_out.data_ptr(), x.data_ptr(),
        residual.data_ptr(), weight.data_ptr(), dtype is _BF16, rows, n,
        torch.get_num_threads(), eps,
    )  # fmt: skip
    return out, residual_out


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [..., 2d] -> silu(x[..., :d]) * x[..., d:], float32 or bfloat16."""
    op = "silu_and_mul"
    dtype = _float_dtype(x)
    _check(op, "x", x, _ANY_DIMS, "[..., 2d]", dtype)
    width = x.shape[-1]
    _require(op, width % 2 == 0, "x's last dim must be even, got shape {}", list(x.shape))
    d = width // 2
    out = x.new_empty(*x.shape[:-1], d)
    rows = x.numel() // width if width else 0
    _launch(
        _C.silu_and_mul, out.data_ptr(), x.data_ptr(), dtype is _BF16, rows, d,
        torch.get_num_threads(),
    )  # fmt: skip
    return out


def convert(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x (float32 or bfloat16, contiguous) as a new contiguous tensor of dtype (float32 or
    bfloat16), rounded as torch's .to(dtype) rounds."""
    op = "convert"
    _check(op, "x", x, _ANY_DIMS, "[...]", _float_dtype(x))
    _require(op, dtype in (_F32, _BF16), "dtype must be float32 or bfloat16, got {}", dtype)
    out = torch.empty(x.shape, dtype=dtype)
    _launch(_C.convert, out.data_ptr(), dtype is _BF16, x.data_ptr(), x.dtype is _BF16, x.numel())
    return out


def argmax(x: torch.Tensor) -> torch.Tensor:
    """x [rows, n] float32 or bfloat16, n >= 1 -> int64 [rows]: torch.argmax(x, dim=-1) (the
    first largest value's index, or the first NaN's)."""
    op = "argmax"
    _check(op, "x", x, 2, "[rows, n]", _float_dtype(x))
    rows, n = x.shape
    _require(op, n > 0, "x must have at least one column, got shape {}", list(x.shape))
    out = torch.empty(rows, dtype=_I64)
    _launch(
        _C.argmax, out.data_ptr(), x.data_ptr(), x.dtype is _BF16, rows, n, torch.get_num_threads()
    )
    return out


def rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox_style: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """query [T, H * head_size], key [T, KV * head_size] (rows may be strided; both float32 or
    both bfloat16) rotated by cos_sin_cache [max_pos, rotary_dim] (float32) at positions [T]
    -> new contiguous tensors of their dtype."""
    op = "rotary_embedding"
    dtype = _float_dtype(query)
    _check(op, "positions", positions, 1, "[T]", _I64)
    _check(op, "query", query, 2, "[T, num_heads * head_size]", dtype, rows=True)
    _check(op, "key", key, 2, "[T, num_kv_heads * head_size]", dtype, rows=True)
    _check(op, "cos_sin_cache", cos_sin_cache, 2, "[max_position, rotary_dim]")
    (t,), (q_rows, q_width), (k_rows, k_width) = positions.shape, query.shape, key.shape
    num_positions, rotary_dim = cos_sin_cache.shape
    _require(op, q_rows == k_rows == t, "query, key and positions have {}, {} and {} tokens",
             q_rows, k_rows, t)  # fmt: skip
    _require(
        op,
        type(head_size) is int and 0 < rotary_dim <= head_size and rotary_dim % 2 == 0,
        "rotary_dim {} must be even and in [2, head_size={!r}]",
        rotary_dim,
        head_size,
    )
    _require(op, q_width % head_size == 0 and k_width % head_size == 0,
             "query width {} and key width {} must be multiples of head_size {}",
             q_width, k_width, head_size)  # fmt: skip
    query_out, key_out = query.new_empty(t, q_width), key.new_empty(t, k_width)
    _launch(
        _C.rotary_embedding, positions.data_ptr(), query.data_ptr(), key.data_ptr(),
        query_out.data_ptr(), key_out.data_ptr(), dtype is _BF16, query.stride(0), key.stride(0), t,
        q_width // head_size, k_width // head_size, head_size, rotary_dim,
        cos_sin_cache.data_ptr(), num_positions, int(is_neox_style), torch.get_num_threads(),
    )  # fmt: skip
    return query_out, key_out


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Stores key/value [T, KV, D] (rows may be strided) in the caches [num_blocks,
    block_size, KV, D] at slot_mapping [T] (-1: a padding token, skipped); each side float32
    or bfloat16 (converted)."""
    op = "reshape_and_cache"
    kv_dtype, cache_dtype = _float_dtype(key), _float_dtype(k_cache)
    _check(op, "key", key, 3, "[T, num_kv_heads, head_dim]", kv_dtype, rows=True)
    _check(op, "value", value, key.shape, "[T, num_kv_heads, head_dim] like key", kv_dtype,
           rows=True)  # fmt: skip
    _check(op, "k_cache", k_cache, 4, _CACHE, cache_dtype)
    _check(op, "v_cache", v_cache, k_cache.shape, _CACHE + " like k_cache", cache_dtype)
    t, kv, d = key.shape
    num_blocks, block_size, cache_kv, cache_d = k_cache.shape
    _require(op, (cache_kv, cache_d) == (kv, d), "k_cache has {} kv heads of size {}, key has "
             "{} of size {}", cache_kv, cache_d, kv, d)  # fmt: skip
    _check(op, "slot_mapping", slot_mapping, (t,), "[T]", _I64)
    _launch(
        _C.reshape_and_cache, key.data_ptr(), value.data_ptr(), kv_dtype is _BF16,
        k_cache.data_ptr(), v_cache.data_ptr(), cache_dtype is _BF16, slot_mapping.data_ptr(),
        t, key.stride(0), value.stride(0), kv * d, num_blocks * block_size,
    )  # fmt: skip


def paged_decode_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    isa: str | None = None,
) -> torch.Tensor:
    """query [B, H, D] float32, one new token per sequence; caches [num_blocks, block_size,
    KV, D], float32 or bfloat16; block_tables [B, max_blocks] and seq_lens [B], int32 ->
    float32 [B, H, D]. isa: one of paged_attention_isas(), or None for the best."""
    op = "paged_decode_attention"
    cache_dtype = _float_dtype(k_cache)
    _check(op, "query", query, 3, "[num_seqs, num_heads, head_dim]")
    _check(op, "k_cache", k_cache, 4, _CACHE, cache_dtype)
    _check(op, "v_cache", v_cache, k_cache.shape, _CACHE + " like k_cache", cache_dtype)
    _check(op, "block_tables", block_tables, 2, "[num_seqs, max_blocks]", _I32)
    b, h, d = query.shape
    num_blocks, block_size, kv, cache_d = k_cache.shape
    _check(op, "seq_lens", seq_lens, (b,), "[num_seqs]", _I32)
    _require(op, cache_d == d, "k_cache head_dim {} differs from query's {}", cache_d, d)
    _require(op, kv > 0 and h % kv == 0, "num_kv_heads {} must divide num_heads {}", kv, h)
    _require(op, block_tables.shape[0] == b, "block_tables has {} rows for {} sequences",
             block_tables.shape[0], b)  # fmt: skip
    isa_index = _isa_index(op, isa, _ATTENTION_ISAS)
    out = torch.empty_like(query)
    _launch(
        _C.paged_decode_attention, out.data_ptr(), query.data_ptr(), k_cache.data_ptr(),
        v_cache.data_ptr(), cache_dtype is _BF16, block_tables.data_ptr(), seq_lens.data_ptr(),
        b, h, kv, d, block_size, block_tables.shape[1], num_blocks, isa_index,
        torch.get_num_threads(), scale,
    )  # fmt: skip
    return out


def _check_qtype(op: str, qtype: object) -> None:
    if not isinstance(qtype, int) or qtype not in _GGUF_SIZES:
        names = ", ".join(f"{t.name}={int(t)}" for t in GGUF_TYPES)
        raise ValueError(f"{op}: qtype {qtype!r} is not one of the supported GGUF types {names}")


def _check_gguf_weight(op: str, qweight: object, qtype: object) -> tuple[int, int]:
    """qweight [N, bytes] of whole qtype blocks -> (N, K)."""
    _check_qtype(op, qtype)
    _check(op, "qweight", qweight, 2, "[N, K / block_size * type_size]", _U8)
    n, row_bytes = qweight.shape
    block_size, type_size = _GGUF_SIZES[qtype]
    if row_bytes % type_size:
        raise ValueError(
            f"{op}: qweight rows of {row_bytes} bytes are not whole {_Q(qtype).name} blocks of "
            f"{type_size} bytes"
        )
    return n, row_bytes // type_size * block_size


def gguf_packed_shape(qtype: int, n: int, k: int) -> tuple[int, int]:
    """The shape of gguf_pack's result for a weight [n, k] of qtype: [groups of 16 rows,
    bytes per group] (csrc/gguf_packed.h)."""
    return -(-n // 16), _C.gguf_packed_bytes(int(qtype), 16, k)


def gguf_weight_shape(qweight: torch.Tensor, qtype: int) -> tuple[int, int]:
    """(N, K) of the GGUF blocks qweight [N, K / block_size * type_size] of qtype."""
    return _check_gguf_weight("gguf_weight_shape", qweight, qtype)


def gguf_pack(qweight: torch.Tensor, qtype: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """qweight [N, K / block_size * type_size] of qtype blocks -> the layout gguf_mm reads,
    uint8 gguf_packed_shape(qtype, N, K) (written to out when given)."""
    op = "gguf_pack"
    n, k = _check_gguf_weight(op, qweight, qtype)
    shape = gguf_packed_shape(qtype, n, k)
    if out is None:
        out = torch.empty(shape, dtype=_U8)
    else:
        _check(op, "out", out, shape, "gguf_packed_shape(qtype, N, K)", _U8)
    _launch(
        _C.gguf_pack, qweight.data_ptr(), out.data_ptr(), int(qtype), n, k,
        torch.get_num_threads(),
    )  # fmt: skip
    return out


def _check_packed(op: str, packed: object, qtype: object, n: int, k: int) -> None:
    _check_qtype(op, qtype)
    block_size = _GGUF_SIZES[qtype][0]
    _require(op, k > 0 and k % block_size == 0, "K = {} is not whole blocks of {}", k, block_size)
    shape = gguf_packed_shape(qtype, n, k)
    _check(op, "packed", packed, shape, f"gguf_packed_shape({_Q(qtype).name}, N={n}, K={k})", _U8)


def gguf_mm(
    x: torch.Tensor,
    packed: torch.Tensor,
    qtype: int,
    n: int,
    bias: torch.Tensor | None = None,
    isa: str | None = None,
) -> torch.Tensor:
    """x [M, K] @ W^T (+ bias [N]) -> [M, N] in x's dtype (float32 or bfloat16; bias the
    same), W [N, K] the qtype weight gguf_pack made `packed` of. Each x row is quantized to
    8-bit blocks of 32 first; a row's result does not depend on the other rows. isa: one of
    gguf_isas(), or None for the best."""
    op = "gguf_mm"
    dtype = _float_dtype(x)
    _check(op, "x", x, 2, "[M, K]", dtype)
    m, k = x.shape
    _check_packed(op, packed, qtype, n, k)
    if bias is not None:
        _check(op, "bias", bias, (n,), "[N]", dtype)
    isa_index = _isa_index(op, isa, _GGUF_ISAS)
    y = torch.empty(m, n, dtype=dtype)
    if m and n:
        _launch(
            _C.gguf_mm, x.data_ptr(), packed.data_ptr(), 0 if bias is None else bias.data_ptr(),
            y.data_ptr(), dtype is _BF16, int(qtype), m, n, k, isa_index,
            torch.get_num_threads(),
        )  # fmt: skip
    return y


def gguf_unpack_rows(
    packed: torch.Tensor, qtype: int, n: int, k: int, rows: torch.Tensor
) -> torch.Tensor:
    """Rows `rows` (int64 [R], each in [0, n)) of the weight [n, k] gguf_pack made `packed`
    of, as float32 [R, k], bit-equal to gguf.quants.dequantize of its blocks."""
    op = "gguf_unpack_rows"
    _check_packed(op, packed, qtype, n, k)
    _check(op, "rows", rows, 1, "[R]", _I64)
    out = torch.empty(rows.shape[0], k, dtype=_F32)
    _launch(
        _C.gguf_unpack_rows, packed.data_ptr(), out.data_ptr(), int(qtype), n, k,
        rows.data_ptr(), rows.shape[0], torch.get_num_threads(),
    )  # fmt: skip
    return out


def gguf_dequantize(
    qweight: torch.Tensor, qtype: int, out: torch.Tensor | None = None
) -> torch.Tensor:
    """qweight [N, K / block_size * type_size] of qtype blocks -> float32 [N, K], bit-equal
    to gguf.quants.dequantize; written to out [N, K] when given."""
    op = "gguf_dequantize"
    n, k = _check_gguf_weight(op, qweight, qtype)
    if out is None:
        out = torch.empty(n, k, dtype=_F32)
    else:
        _check(op, "out", out, (n, k), "[N, K]")
    _launch(
        _C.gguf_dequantize, qweight.data_ptr(), out.data_ptr(), int(qtype), n, k,
        torch.get_num_threads(),
    )  # fmt: skip
    return out
