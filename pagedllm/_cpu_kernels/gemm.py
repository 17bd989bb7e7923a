"""The matmul kernels of unquantized weights: skinny_gemm (float32, bfloat16) on plain or
skinny_pack'ed weights, and amx_gemm_bf16 on AMX tiles."""

import torch

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
from pagedllm._cpu_kernels.flags import FLOAT_TYPE, FloatType, WeightLayout

_F32, _BF16 = torch.float32, torch.bfloat16

SKINNY_PACKED = {_F32: (16, 8, "[N / 16, K, 16]"), _BF16: (4, 32, "[N / 4, K / 32, 4, 32]")}
"""Per dtype, the packed order skinny_gemm reads: N a multiple of the first number, K of the
second (csrc/ops.h's SKINNY_PANEL_ROWS and the avx2 build's lanes; SKINNY_PACK_ROWS and
SKINNY_PACK_K), and its shape."""

_AMX_PACKED = "[N / 16, K / 32, 16, 32]"


def _skinny_kernel(name: str, dtype: torch.dtype) -> Kernel:
    """skinny_gemm's declaration for tensors of dtype: weight plain or packed."""
    packed = SKINNY_PACKED[dtype][2]
    return Kernel(
        name,
        Tensor("x", "[M, K]", dtype),
        Tensor("weight", f"[N, K] or {packed}", dtype, rank=(2, packed.count(",") + 1)),
        Tensor("bias", "[N]", dtype, optional=True),
        Output("y"),
        Int("M"),
        Int("N"),
        Int("K"),
        Flag("layout", WeightLayout),
        Int("isa"),
        Int("num_threads"),
    )


SKINNY_GEMM = _skinny_kernel("skinny_gemm", _F32)
SKINNY_GEMM_BF16 = _skinny_kernel("skinny_gemm_bf16", _BF16)
AMX_GEMM_BF16 = Kernel(
    "amx_gemm_bf16",
    Tensor("x", "[M, K]", _BF16),
    Tensor("packed", _AMX_PACKED, _BF16),
    Tensor("bias", "[N]", _BF16, optional=True),
    Output("y"),
    Int("M"),
    Int("N"),
    Int("K"),
    Int("num_threads"),
)
AMX_PACK_BF16 = Kernel(
    "amx_pack_bf16", Output("packed"), Tensor("weight", "[N, K]", _BF16), Int("N"), Int("K")
)
_check_pack_weight = checks("skinny_pack", Tensor("weight", "[N, K]", "float"))

_SKINNY_ISAS = isa_table("skinny_gemm_isas")


def skinny_gemm_isas() -> tuple[str, ...]:
    """The builds of skinny_gemm this CPU runs, best first (empty without _C)."""
    return supported(_SKINNY_ISAS)


def skinny_gemm_reads_packed(dtype: torch.dtype, isa: str | None = None) -> bool:
    """Whether that build of skinny_gemm (the best for None) reads weights of dtype (float32
    or bfloat16) in skinny_pack's order (False without _C)."""
    if package._C is None:
        return False
    index = isa_index("skinny_gemm_reads_packed", isa, _SKINNY_ISAS)
    flag = FLOAT_TYPE.get(dtype, FloatType.FLOAT32)
    return package._C.skinny_gemm_reads_packed(index, flag)


def skinny_gemm(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, isa: str | None = None
) -> torch.Tensor:
    """x [M, K] @ weight [N, K]^T (+ bias [N]) -> [M, N], float32; weight plain or in
    skinny_pack's panels [N / 16, K, 16] (read by the avx2 build only: ValueError elsewhere;
    the same bits as the plain weight's). Each output is summed in one order whatever M is.
    isa: one of skinny_gemm_isas(), or None for the best."""
    return _skinny_gemm(SKINNY_GEMM, _F32, x, weight, bias, isa)


def skinny_gemm_bf16(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, isa: str | None = None
) -> torch.Tensor:
    """skinny_gemm on bfloat16 tensors (float32 products and sums) -> bfloat16 [M, N]; weight
    plain or in skinny_pack's tiles [N / 4, K / 32, 4, 32] (read by the avx512_bf16 build
    only). isa: as in skinny_gemm (the same builds)."""
    return _skinny_gemm(SKINNY_GEMM_BF16, _BF16, x, weight, bias, isa)


def _skinny_gemm(
    kernel: Kernel,
    dtype: torch.dtype,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    isa: str | None,
) -> torch.Tensor:
    """The checks and launch of a skinny_gemm kernel on a weight plain [N, K] or in
    skinny_pack's order (for the builds that skinny_gemm_reads_packed)."""
    op = kernel.name
    index = isa_index(op, isa, _SKINNY_ISAS)
    kernel.check(x, weight, bias)
    if weight.dim() == 2:
        n, k = weight.shape
        return _gemm(kernel, x, weight, "weight [N, K]", n, k, bias, WeightLayout.PLAIN, index)
    n, k = _skinny_packed_size(op, dtype, weight)
    require(
        op,
        package._C.skinny_gemm_reads_packed(index, FLOAT_TYPE[dtype]),
        "build {!r} does not read packed weights (only the {} build does)",
        isa or skinny_gemm_isas()[0],
        "avx512_bf16" if dtype is _BF16 else "avx2",
    )
    return _gemm(kernel, x, weight, "packed weight", n, k, bias, WeightLayout.PACKED, index)


def _skinny_packed_size(op: str, dtype: torch.dtype, weight: torch.Tensor) -> tuple[int, int]:
    """(N, K) of a weight in skinny_pack's order for dtype, of its rank (checked)."""
    rows, k_step, layout = SKINNY_PACKED[dtype]
    if dtype is _BF16:
        return _tiles_size(op, weight, (rows, k_step), layout)
    blocks, k, lanes = weight.shape
    require(
        op,
        lanes == rows and blocks > 0 and k > 0 and k % k_step == 0,
        "packed weight {} is not {} with K % {} == 0",
        tuple(weight.shape),
        layout,
        k_step,
    )
    return blocks * rows, k


def _tiles_size(
    op: str, packed: torch.Tensor, tile: tuple[int, int], layout: str
) -> tuple[int, int]:
    """(N, K) of a 4-D bfloat16 weight packed in tiles of `tile` (rows, values of K), its
    last two dimensions."""
    blocks_n, blocks_k, rows, cols = packed.shape
    require(
        op,
        (rows, cols) == tile and blocks_n > 0 and blocks_k > 0,
        "packed weight {} is not {}",
        tuple(packed.shape),
        layout,
    )
    return blocks_n * rows, blocks_k * cols


def _gemm(
    kernel: Kernel,
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_name: str,
    n: int,
    weight_k: int,
    bias: torch.Tensor | None,
    *flags: int,
) -> torch.Tensor:
    """The launch of matmul `kernel` on checked tensors and a weight of n outputs and
    weight_k inputs (flags: the kernel's arguments between K and the thread count)."""
    m, k = x.shape
    require(
        kernel.name, weight_k == k, "{} has K = {}, x [M, K] has K = {}", weight_name, weight_k, k
    )
    if bias is not None:
        kernel.check_shape("bias", bias, (n,))
    y = x.new_empty(m, n)
    kernel.launch(x, weight, bias, y, m, n, k, *flags, torch.get_num_threads())
    return y


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
    op = "skinny_pack"
    _check_pack_weight(weight)
    rows, k_step, _ = SKINNY_PACKED[weight.dtype]
    require(
        op,
        skinny_packable(weight),
        "weight [N, K] = {} needs N % {} == 0 and K % {} == 0",
        list(weight.shape),
        rows,
        k_step,
    )
    n, k = weight.shape
    if weight.dtype is _F32:
        return weight.view(n // rows, rows, k).transpose(1, 2).contiguous()
    return weight.view(n // rows, rows, k // k_step, k_step).transpose(1, 2).contiguous()


def amx_available() -> bool:
    """Whether amx_gemm_bf16 runs here: the CPU has AMX bf16 tiles and Linux granted them."""
    return package._C is not None and package._C.amx_gemm_supported()


def amx_pack_bf16(weight: torch.Tensor) -> torch.Tensor:
    """weight [N, K] bfloat16 (N % 16 == 0, K % 32 == 0) -> [N / 16, K / 32, 16, 32]: per
    16 output columns and 32 of K, the tile whose row r holds each column's elements 2r and
    2r + 1 (csrc/amx_gemm.c)."""
    AMX_PACK_BF16.check(weight)
    n, k = weight.shape
    require(
        AMX_PACK_BF16.name,
        n % 16 == 0 and k % 32 == 0 and n > 0 and k > 0,
        "weight [N, K] = [{}, {}] needs N % 16 == 0 and K % 32 == 0",
        n,
        k,
    )
    packed = weight.new_empty(n // 16, k // 32, 16, 32)
    AMX_PACK_BF16.launch(packed, weight, n, k)
    return packed


def amx_gemm_bf16(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [M, K] @ weight^T (+ bias [N]) -> bfloat16 [M, N] on AMX tiles, for packed =
    amx_pack_bf16(weight); float32 sums, each row's the same bits whatever M is. Raises
    RuntimeError where not amx_available()."""
    AMX_GEMM_BF16.check(x, packed, bias)
    n, k = _tiles_size(AMX_GEMM_BF16.name, packed, (16, 32), _AMX_PACKED)
    return _gemm(AMX_GEMM_BF16, x, packed, "packed weight", n, k, bias)
