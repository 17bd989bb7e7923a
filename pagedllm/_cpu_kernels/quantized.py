"""The kernels of GGUF (and int8) weights: packing GGUF blocks into gguf_mm's layout, the
matmul on it, rows read back from it, and plain dequantization."""

import torch
from gguf import GGML_QUANT_SIZES

from pagedllm import _cpu_kernels as package
from pagedllm._cpu_kernels.boundary import (
    Flag,
    Int,
    Kernel,
    Output,
    Tensor,
    checks,
    isa_index,
    isa_table,
    require,
    supported,
)
from pagedllm._cpu_kernels.flags import FLOAT_TYPE, GGUF_TYPES, FloatType

_F32, _I64, _U8 = torch.float32, torch.int64, torch.uint8
_QTYPE = {int(t): t for t in GGUF_TYPES}
_GGUF_SIZES = {int(t): GGML_QUANT_SIZES[t] for t in GGUF_TYPES}  # (block_size, type_size)
QType = type(GGUF_TYPES[0])
_QWEIGHT = "[N, K / block_size * type_size]"
_PACKED = "gguf_packed_shape(qtype, N, K)"
_QWEIGHT_ARG = Tensor("qweight", _QWEIGHT, _U8)
_check_qweight = checks("gguf_weight_shape", _QWEIGHT_ARG)

GGUF_MM = Kernel(
    "gguf_mm",
    Tensor("x", "[M, K]", "float"),
    Tensor("packed", _PACKED, _U8, rank=2),
    Tensor("bias", "[N]", "float", optional=True),
    Output("y"),
    Flag("dtype", FloatType),
    Flag("qtype", QType),
    Int("M"),
    Int("N"),
    Int("K"),
    Int("isa"),
    Int("num_threads"),
)
GGUF_PACK = Kernel(
    "gguf_pack",
    _QWEIGHT_ARG,
    Tensor("out", _PACKED, _U8, rank=2, optional=True),
    Flag("qtype", QType),
    Int("N"),
    Int("K"),
    Int("num_threads"),
)
GGUF_UNPACK_ROWS = Kernel(
    "gguf_unpack_rows",
    Tensor("packed", _PACKED, _U8, rank=2),
    Output("out"),
    Flag("qtype", QType),
    Int("K"),
    Tensor("rows", "[R]", _I64),
    Int("n"),
    Int("num_threads"),
    Int("N"),
)
GGUF_DEQUANTIZE = Kernel(
    "gguf_dequantize",
    _QWEIGHT_ARG,
    Tensor("out", "[N, K]", _F32, optional=True),
    Flag("qtype", QType),
    Int("rows"),
    Int("K"),
    Int("num_threads"),
)

_GGUF_ISAS = isa_table("gguf_isas")


def gguf_isas() -> tuple[str, ...]:
    """The instruction sets gguf_mm can use on this CPU, best first (empty without _C)."""
    return supported(_GGUF_ISAS)


def _qtype(op: str, qtype: object) -> QType:
    """qtype (an int) as the GGUF type gguf.h names, or ValueError."""
    if not isinstance(qtype, int) or qtype not in _QTYPE:
        names = ", ".join(f"{t.name}={int(t)}" for t in GGUF_TYPES)
        raise ValueError(f"{op}: qtype {qtype!r} is not one of the supported GGUF types {names}")
    return _QTYPE[qtype]


def _weight_shape(op: str, qweight: torch.Tensor, qtype: QType) -> tuple[int, int]:
    """(N, K) of qweight [N, bytes] (checked) if whole qtype blocks, else ValueError."""
    n, row_bytes = qweight.shape
    block_size, type_size = _GGUF_SIZES[qtype]
    if row_bytes % type_size:
        raise ValueError(
            f"{op}: qweight rows of {row_bytes} bytes are not whole {qtype.name} blocks of "
            f"{type_size} bytes"
        )
    return n, row_bytes // type_size * block_size


def gguf_packed_shape(qtype: int, n: int, k: int) -> tuple[int, int]:
    """The shape of gguf_pack's result for a weight [n, k] of qtype: [groups of 16 rows,
    bytes per group] (csrc/gguf_packed.h)."""
    return -(-n // 16), package._C.gguf_packed_bytes(int(qtype), 16, k)


def gguf_weight_shape(qweight: torch.Tensor, qtype: int) -> tuple[int, int]:
    """(N, K) of the GGUF blocks qweight [N, K / block_size * type_size] of qtype."""
    op = "gguf_weight_shape"
    qtype = _qtype(op, qtype)
    _check_qweight(qweight)
    return _weight_shape(op, qweight, qtype)


def gguf_pack(qweight: torch.Tensor, qtype: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """qweight [N, K / block_size * type_size] of qtype blocks -> the layout gguf_mm reads,
    uint8 gguf_packed_shape(qtype, N, K) (written to out when given)."""
    kernel = GGUF_PACK
    qtype = _qtype(kernel.name, qtype)
    kernel.check(qweight, out)
    n, k = _weight_shape(kernel.name, qweight, qtype)
    shape = gguf_packed_shape(qtype, n, k)
    if out is None:
        out = torch.empty(shape, dtype=_U8)
    else:
        kernel.check_shape("out", out, shape)
    kernel.launch(qweight, out, qtype, n, k, torch.get_num_threads())
    return out


def _check_packed(kernel: Kernel, packed: torch.Tensor, qtype: QType, n: int, k: int) -> None:
    """packed (checked) is gguf_pack's layout of a weight [n, k] of qtype."""
    block_size = _GGUF_SIZES[qtype][0]
    whole = k > 0 and k % block_size == 0
    require(kernel.name, whole, "K = {} is not whole blocks of {}", k, block_size)
    shape = gguf_packed_shape(qtype, n, k)
    kernel.check_shape("packed", packed, shape, f"gguf_packed_shape({qtype.name}, N={n}, K={k})")


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
    kernel = GGUF_MM
    qtype = _qtype(kernel.name, qtype)
    kernel.check(x, packed, bias)
    m, k = x.shape
    _check_packed(kernel, packed, qtype, n, k)
    if bias is not None:
        kernel.check_shape("bias", bias, (n,))
    index = isa_index(kernel.name, isa, _GGUF_ISAS)
    y = torch.empty(m, n, dtype=x.dtype)
    if m and n:
        threads = torch.get_num_threads()
        kernel.launch(x, packed, bias, y, FLOAT_TYPE[x.dtype], qtype, m, n, k, index, threads)
    return y


def gguf_unpack_rows(
    packed: torch.Tensor, qtype: int, n: int, k: int, rows: torch.Tensor
) -> torch.Tensor:
    """Rows `rows` (int64 [R], each in [0, n)) of the weight [n, k] gguf_pack made `packed`
    of, as float32 [R, k], bit-equal to gguf.quants.dequantize of its blocks."""
    kernel = GGUF_UNPACK_ROWS
    qtype = _qtype(kernel.name, qtype)
    kernel.check(packed, rows)
    _check_packed(kernel, packed, qtype, n, k)
    out = torch.empty(rows.shape[0], k, dtype=_F32)
    kernel.launch(packed, out, qtype, k, rows, rows.shape[0], torch.get_num_threads(), n)
    return out


def gguf_dequantize(
    qweight: torch.Tensor, qtype: int, out: torch.Tensor | None = None
) -> torch.Tensor:
    """qweight [N, K / block_size * type_size] of qtype blocks -> float32 [N, K], bit-equal
    to gguf.quants.dequantize; written to out [N, K] when given."""
    kernel = GGUF_DEQUANTIZE
    qtype = _qtype(kernel.name, qtype)
    kernel.check(qweight, out)
    n, k = _weight_shape(kernel.name, qweight, qtype)
    if out is None:
        out = torch.empty(n, k, dtype=_F32)
    else:
        kernel.check_shape("out", out, (n, k))
    kernel.launch(qweight, out, qtype, n, k, torch.get_num_threads())
    return out
