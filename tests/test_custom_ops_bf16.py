"""_custom_ops on bfloat16 tensors: skinny_gemm_bf16 for decode-sized matmuls, KV-cache
writes, decode and prefill attention on a bfloat16 cache, RMSNorm, SiluAndMul and RoPE on bfloat16
activations. References: F.linear in float64 rounded once to bfloat16, torch's own
conversions (bit for bit), the float64 torch definition of paged attention on the same
bfloat16 values, and _torch_ops' norms, activation and rotation on bfloat16 (bit for bit,
or within the bf16 steps that a last float bit of e^x or of a sum can move)."""

import pytest
import torch
import torch.nn.functional as F

from pagedllm import _cpu_kernels, _custom_ops, _torch_ops

BF16 = torch.bfloat16
needs_kernels = pytest.mark.skipif(not _custom_ops.has_cpu_kernels(), reason="no pagedllm._C")


def _bf16_linear_bound(x: torch.Tensor, w: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """One rounding to bfloat16 (half a unit in the last of 8 bits: 2^-8 relative) after a
    float32 sum (2^-20 of sum |x w|, generous for K up to a few thousand)."""
    return ref.abs() * 2.0**-8 + (x.double().abs() @ w.double().abs().T) * 2.0**-20


@needs_kernels
@pytest.mark.parametrize("num_rows", [0, 1, 2, 3, 4, 5, 9, 16, 17, 64, 128, 300])
@pytest.mark.parametrize("in_features", [5, 16, 100, 576])
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_bf16_is_f_linear_rounded_once(
    num_rows: int, in_features: int, with_bias: bool, skinny_gemm_isa: str
) -> None:
    """Every row count runs the kernel, on each build: within one bf16 rounding of the
    float64 product (37 outputs, past the last whole tile; K of 5 and 100 not a multiple of
    the vector width, but 100 on the portable build; 576 a multiple of avx512_bf16's 32)."""
    w = torch.randn(37, in_features).to(BF16)
    b = torch.randn(37).to(BF16) if with_bias else None
    x = torch.randn(num_rows, in_features).to(BF16)
    ref = F.linear(x.double(), w.double(), None if b is None else b.double())
    out = _custom_ops.linear(x, w, b)
    assert out.dtype == BF16 and out.shape == (num_rows, 37)
    assert ((out.double() - ref).abs() <= _bf16_linear_bound(x, w, ref)).all()


@needs_kernels
@pytest.mark.parametrize("with_bias", [False, True])
def test_skinny_gemm_bf16_is_the_float32_kernel_rounded_as_torch_rounds(
    with_bias: bool, skinny_gemm_isa: str
) -> None:
    """Where skinny_gemm_bf16 widens its inputs (every build at K = 48, which is no multiple
    of avx512_bf16's 32 values a dot-product step), its sums are the float32 kernel's on the
    widened values, and its outputs (tiles stored as vectors, the last weight row alone)
    those sums rounded as torch rounds them, exactly, a NaN column staying NaN."""
    w, x = torch.randn(37, 48).to(BF16), torch.randn(9, 48).to(BF16)
    w[3, 5] = float("nan")
    b = torch.randn(37).to(BF16) if with_bias else None
    out = _cpu_kernels.skinny_gemm_bf16(x, w, b)
    ref = _cpu_kernels.skinny_gemm(x.float(), w.float(), None if b is None else b.float())
    assert out[:, 3].isnan().all()
    torch.testing.assert_close(out, ref.to(BF16), rtol=0, atol=0, equal_nan=True)


@needs_kernels
def test_linear_bf16_with_autograd_is_f_linear() -> None:
    w_grad = torch.randn(24, 64).to(BF16).requires_grad_()
    x = torch.randn(2, 64).to(BF16)
    assert torch.equal(_custom_ops.linear(x, w_grad), F.linear(x, w_grad))


needs_amx = pytest.mark.skipif(
    not (_custom_ops.has_cpu_kernels() and _cpu_kernels.amx_available()),
    reason="this CPU has no AMX tiles",
)


@pytest.fixture
def without_amx(monkeypatch: pytest.MonkeyPatch) -> None:
    """prepack_linear_weight as on a CPU with native bf16 matmuls but no AMX tiles."""
    monkeypatch.setattr(_cpu_kernels, "amx_available", lambda: False)


def _check_packed_linear(packed: torch.Tensor, w: torch.Tensor) -> None:
    """linear() on a packed weight: within one bf16 rounding of the float64 product, with
    and without bias, and each row the same bits alone and in batches of 2 to 300 rows."""
    b, x = torch.randn(w.shape[0]).to(BF16), torch.randn(300, w.shape[1]).to(BF16)
    ref = F.linear(x.double(), w.double(), b.double())
    out = _custom_ops.linear(x, packed, b)
    assert out.dtype == BF16 and ((out.double() - ref).abs() <= _bf16_linear_bound(x, w, ref)).all()
    alone = torch.cat([_custom_ops.linear(x[i : i + 1], packed, b) for i in range(0, 300, 7)])
    assert torch.equal(alone, out[::7])
    for rows in (2, 9, 15, 16, 17, 31, 32, 33, 64, 257):
        assert torch.equal(_custom_ops.linear(x[:rows], packed, b), out[:rows])
    x3 = x[:6].view(2, 3, -1)
    assert torch.equal(
        _custom_ops.linear(x3, packed), _custom_ops.linear(x[:6], packed).view(2, 3, -1)
    )


@needs_kernels
def test_amx_packing_is_the_tiles_of_element_pairs() -> None:
    """amx_pack_bf16 (plain C, any CPU): per 16 columns and 32 of K, row r of the tile holds
    each column's elements 2r and 2r + 1, the pairs TDPBF16PS multiplies."""
    w = torch.randn(48, 96).to(BF16)
    tiles = w.view(3, 16, 3, 16, 2).permute(0, 2, 3, 1, 4).reshape(3, 3, 16, 32)
    assert torch.equal(_cpu_kernels.amx_pack_bf16(w), tiles)


def test_skinny_packing_is_each_tiles_rows_step_by_step() -> None:
    """skinny_pack on bf16: per 4 weight rows and 32 of K, the 4 rows' 32 values side by
    side; _torch_ops.unpack_skinny gives the weight back."""
    w = torch.randn(8, 96).to(BF16)
    packed = _cpu_kernels.skinny_pack(w)
    assert packed.shape == (2, 3, 4, 32)
    for tile, step, row in ((0, 0, 0), (1, 2, 3), (0, 1, 2)):
        k = 32 * step
        assert torch.equal(packed[tile, step, row], w[4 * tile + row, k : k + 32])
    assert torch.equal(_torch_ops.unpack_skinny(packed), w)
    with pytest.raises(ValueError, match=r"needs N % 4 == 0 and K % 32 == 0"):
        _cpu_kernels.skinny_pack(torch.randn(6, 32).to(BF16))


needs_dp_build = pytest.mark.skipif(
    not _custom_ops.has_cpu_kernels() or "avx512_bf16" not in _cpu_kernels.skinny_gemm_isas(),
    reason="this CPU has no AVX-512 BF16 dot products",
)


@needs_dp_build
@pytest.mark.parametrize("num_rows", [1, 2, 3, 4, 5, 17, 64, 128, 300])
@pytest.mark.parametrize("with_bias", [False, True])
def test_skinny_gemm_bf16_reads_a_packed_weight_as_the_plain_one(
    num_rows: int, with_bias: bool
) -> None:
    """The avx512_bf16 build on skinny_pack's order: the plain weight's bits (the same
    products, summed in the same order), at every row count, NaN included."""
    w, x = torch.randn(96, 576).to(BF16), torch.randn(num_rows, 576).to(BF16)
    w[5, 7] = float("nan")
    b = torch.randn(96).to(BF16) if with_bias else None
    packed = _cpu_kernels.skinny_pack(w)
    plain = _cpu_kernels.skinny_gemm_bf16(x, w, b, isa="avx512_bf16")
    out = _cpu_kernels.skinny_gemm_bf16(x, packed, b, isa="avx512_bf16")
    torch.testing.assert_close(out, plain, rtol=0, atol=0, equal_nan=True)
    assert out[:, 5].isnan().all()


@needs_dp_build
def test_skinny_packed_linear_is_the_kernel_on_the_plain_weight(
    without_amx: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """prepack_linear_weight on a CPU whose best skinny build is avx512_bf16 (no AMX): the
    packed order. linear() on it: the kernel's bits on the plain weight at every row count;
    3-D x too; the torch path (F.linear on the plain weight) without the extension."""
    w, b = torch.randn(200, 576).to(BF16), torch.randn(200).to(BF16)
    packed = _custom_ops.prepack_linear_weight(w)
    assert packed.shape == (50, 18, 4, 32)
    x = torch.randn(600, 576).to(BF16)
    assert torch.equal(_custom_ops.linear(x, packed, b), _cpu_kernels.skinny_gemm_bf16(x, w, b))
    x3 = x[:6].view(2, 3, -1)
    assert torch.equal(_custom_ops.linear(x3, packed), _custom_ops.linear(x[:6], w).view(2, 3, -1))
    monkeypatch.setattr(_cpu_kernels, "_C", None)  # the torch path unpacks it itself
    assert torch.equal(_custom_ops.linear(x[:3], packed, b), F.linear(x[:3], w, b))


@needs_amx
@pytest.mark.parametrize("shape", [(1008, 576), (48, 1536), (16, 32)])
def test_amx_linear_is_rounded_once_and_batch_invariant_at_every_size(
    shape: tuple[int, int],
) -> None:
    """AMX tiles (prepack_linear_weight here): 4-D, and every row count runs the kernel,
    whose float32 sums take each row in one order whatever the batch (an odd number of
    16-column blocks, 48, included)."""
    w = torch.randn(shape).to(BF16)
    packed = _custom_ops.prepack_linear_weight(w)
    assert packed.shape == (shape[0] // 16, shape[1] // 32, 16, 32)
    _check_packed_linear(packed, w)


@needs_amx
def test_amx_packed_copy_of_a_tied_head_runs_for_every_row_count() -> None:
    """linear(x, w, packed_weight=tiles) (a tied LM head) multiplies the tiles for any number
    of rows: one kernel, so decode steps of every size give a row the same bits."""
    w = torch.randn(320, 576).to(BF16)
    packed = _custom_ops.prepack_linear_weight(w)
    assert packed.dim() == 4
    for rows in (1, 4, 5, 16, 17):
        x = torch.randn(rows, 576).to(BF16)
        assert torch.equal(
            _custom_ops.linear(x, w, packed_weight=packed), _custom_ops.linear(x, packed)
        )


@needs_kernels
def test_convert_rounds_like_torch() -> None:
    """float32 -> bfloat16 -> float32 through the kernel: torch's .to() bit for bit (ties to
    even, infinities, overflow, denormals) and NaN for NaN (torch's vectorized narrowing
    gives 0xffff, its scalar one and the kernel 0x7fc0), odd lengths past the 16-wide loop."""
    x = _special_values((37,))
    narrowed = _cpu_kernels.convert(x, BF16)
    nan = x.isnan()
    assert torch.equal(narrowed.isnan(), nan)
    assert torch.equal(narrowed[~nan].view(torch.int16), x[~nan].to(BF16).view(torch.int16))
    widened = _cpu_kernels.convert(narrowed, torch.float32)
    assert torch.equal(widened.view(torch.int32), narrowed.float().view(torch.int32))
    assert torch.equal(
        _cpu_kernels.convert(x, torch.float32).view(torch.int32), x.view(torch.int32)
    )


def test_prepack_keeps_weights_it_cannot_pack(monkeypatch: pytest.MonkeyPatch) -> None:
    """float16, autograd, a shape that is neither whole AMX tiles nor whole skinny blocks, a
    CPU whose skinny build has no packed order for the dtype, or no extension: the weight."""
    w16 = torch.randn(16, 32).half()
    assert _custom_ops.prepack_linear_weight(w16) is w16
    grad = torch.randn(16, 32).to(BF16).requires_grad_()
    assert _custom_ops.prepack_linear_weight(grad) is grad
    odd = torch.randn(22, 48).to(BF16)
    assert _custom_ops.prepack_linear_weight(odd) is odd
    monkeypatch.setattr(_cpu_kernels, "skinny_gemm_reads_packed", lambda dtype: False)
    monkeypatch.setattr(_cpu_kernels, "amx_available", lambda: False)
    w, w32 = torch.randn(32, 32).to(BF16), torch.randn(32, 32)
    assert _custom_ops.prepack_linear_weight(w) is w
    assert _custom_ops.prepack_linear_weight(w32) is w32
    monkeypatch.undo()
    monkeypatch.setattr(_cpu_kernels, "_C", None)
    assert _custom_ops.prepack_linear_weight(w) is w


def _special_values(shape: tuple[int, ...]) -> torch.Tensor:
    """Random floats plus values that test rounding: ties, NaN, infinities, the largest
    finite float32 (rounds to bf16 infinity), denormals."""
    x = torch.randn(shape)
    flat = x.view(-1)
    specials = [
        1.0 + 2.0**-8,
        1.0 + 3 * 2.0**-8,
        float("nan"),
        float("inf"),
        -float("inf"),
        3.4028235e38,
        1e-40,
        -0.0,
    ]
    flat[: len(specials)] = torch.tensor(specials)
    return x


@needs_kernels
@pytest.mark.parametrize("key_dtype", [torch.float32, BF16])
@pytest.mark.parametrize("cache_dtype", [torch.float32, BF16])
def test_reshape_and_cache_converts_like_torch(
    key_dtype: torch.dtype, cache_dtype: torch.dtype
) -> None:
    """Keys and values (column slices of a fused qkv, as the model passes them) land in their
    slots converted exactly as torch's .to() converts them: bit for bit, NaN included."""
    qkv = _special_values((5, 3 * 2 * 16)).to(key_dtype)
    key = qkv[:, 32:64].view(5, 2, 16)
    value = qkv[:, 64:].view(5, 2, 16)
    slots = torch.tensor([7, 0, 12, 3, 9])
    caches = [torch.zeros(4, 4, 2, 16, dtype=cache_dtype) for _ in range(4)]
    _custom_ops.reshape_and_cache(key, value, caches[0], caches[1], slots)
    _torch_ops.reshape_and_cache(key, value, caches[2], caches[3], slots)
    for actual, expected in zip(caches[:2], caches[2:], strict=True):
        assert torch.equal(
            actual.view(torch.int16 if cache_dtype == BF16 else torch.int32),
            expected.view(torch.int16 if cache_dtype == BF16 else torch.int32),
        )


@needs_kernels
@pytest.mark.parametrize("query_dtype", [torch.float32, BF16])
@pytest.mark.parametrize(
    "num_heads,num_kv_heads,head_size", [(9, 3, 64), (4, 1, 80), (16, 2, 128), (10, 2, 96)]
)
def test_paged_decode_attention_on_a_bf16_cache(
    query_dtype: torch.dtype, num_heads: int, num_kv_heads: int, head_size: int, attention_isa: str
) -> None:
    """Reference: the float64 torch definition on the same (bf16-valued) cache and query,
    rounded to the query's dtype; lengths 1 to 1,100 (three partitions) over scattered
    blocks."""
    block_size, num_blocks = 16, 100
    shape = (num_blocks, block_size, num_kv_heads, head_size)
    k_cache, v_cache = torch.randn(shape).to(BF16), torch.randn(shape).to(BF16)
    seq_lens = torch.tensor([1, 17, 1100, 33], dtype=torch.int32)
    tables = torch.stack([torch.randperm(num_blocks)[:70] for _ in seq_lens]).to(torch.int32)
    query = torch.randn(len(seq_lens), num_heads, head_size).to(query_dtype)
    out = _custom_ops.paged_decode_attention(query, k_cache, v_cache, tables, seq_lens, 1100, 0.1)
    expected = _torch_ops.paged_decode_attention(
        query.double(), k_cache.double(), v_cache.double(), tables, seq_lens, 1100, 0.1
    )
    assert out.dtype == query_dtype
    # a bf16 output may round to the other neighbour: one bf16 ulp, 2^-8 to 2^-7 of the value
    tolerance = (
        {"rtol": 2.0**-7, "atol": 1e-5} if query_dtype == BF16 else {"rtol": 1e-5, "atol": 2e-5}
    )
    torch.testing.assert_close(out.double(), expected.to(query_dtype).double(), **tolerance)


@needs_kernels
@pytest.mark.parametrize("query_dtype", [torch.float32, BF16])
@pytest.mark.parametrize(
    "sliding_window,logits_soft_cap", [(7, 0.0), (600, 0.0), (0, 3.0), (40, 3.0)]
)
def test_paged_decode_attention_on_a_bf16_cache_in_a_window_or_capped(
    query_dtype: torch.dtype, sliding_window: int, logits_soft_cap: float, attention_isa: str
) -> None:
    """Reference: the float64 torch definition with the sliding window and the soft cap, on
    the same (bf16-valued) cache and query, rounded to the query's dtype; lengths 1 to 1,100
    over scattered blocks."""
    block_size, num_blocks = 16, 100
    shape = (num_blocks, block_size, 3, 64)
    k_cache, v_cache = torch.randn(shape).to(BF16), torch.randn(shape).to(BF16)
    seq_lens = torch.tensor([1, 17, 1100, 33, 600], dtype=torch.int32)
    tables = torch.stack([torch.randperm(num_blocks)[:70] for _ in seq_lens]).to(torch.int32)
    query = torch.randn(len(seq_lens), 9, 64).to(query_dtype)
    options = (sliding_window, logits_soft_cap)
    out = _custom_ops.paged_decode_attention(
        query, k_cache, v_cache, tables, seq_lens, 1100, 0.3, *options
    )
    expected = _torch_ops.paged_decode_attention(
        query.double(), k_cache.double(), v_cache.double(), tables, seq_lens, 1100, 0.3, *options
    )
    assert out.dtype == query_dtype
    tolerance = (
        {"rtol": 2.0**-7, "atol": 1e-5} if query_dtype == BF16 else {"rtol": 1e-5, "atol": 2e-5}
    )
    torch.testing.assert_close(out.double(), expected.to(query_dtype).double(), **tolerance)


def _prefill_case(
    num_heads: int, num_kv_heads: int, head_size: int, seq_len: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(queries for all seq_len positions, k_cache, v_cache, block_table) on scattered
    blocks of 16 tokens, bf16."""
    num_blocks, block_size = 64, 16
    shape = (num_blocks, block_size, num_kv_heads, head_size)
    k_cache, v_cache = torch.randn(shape).to(BF16), torch.randn(shape).to(BF16)
    table = torch.randperm(num_blocks)[: -(-seq_len // block_size) + 1].to(torch.int32)
    query = torch.randn(seq_len, num_heads, head_size).to(BF16)
    return query, k_cache, v_cache, table


def test_prefill_attention_on_bf16_is_the_float32_kernel_rounded() -> None:
    """A bf16 chunk runs the float32 kernel on the widened query, its output rounded back to
    bf16, as decode attention does (so that a row is the bits of its decode); without
    pagedllm._C, _torch_ops' sdpa, bit for bit."""
    query, k_cache, v_cache, table = _prefill_case(9, 3, 64, 20)
    q = query[5:]
    out = _custom_ops.prefill_attention(q, k_cache, v_cache, table, 20, 0.125)
    if not _custom_ops.has_cpu_kernels():
        expected = _torch_ops.prefill_attention(q, k_cache, v_cache, table, 20, 0.125)
    else:
        float32 = _cpu_kernels.prefill_attention_f32(q.float(), k_cache, v_cache, table, 20, 0.125)
        expected = float32.to(BF16)
    assert out.dtype == BF16 and torch.equal(out, expected)


@needs_kernels
@pytest.mark.parametrize("sliding_window,logits_soft_cap", [(7, 0.0), (600, 0.0), (30, 3.0)])
def test_prefill_attention_on_bf16_in_a_window_or_capped_is_the_definition(
    sliding_window: int, logits_soft_cap: float, prefill_f32_isa: str
) -> None:
    """Reference: the float64 torch definition with the sliding window and the soft cap on the
    same bf16 values, rounded to bf16: 40 rows after 660 cached tokens (two partitions)."""
    query, k_cache, v_cache, table = _prefill_case(9, 3, 64, 700)
    q, options = query[660:], (sliding_window, logits_soft_cap)
    out = _custom_ops.prefill_attention(q, k_cache, v_cache, table, 700, 0.3, *options)
    expected = _torch_ops.prefill_attention(
        q.double(), k_cache.double(), v_cache.double(), table, 700, 0.3, *options
    )
    assert out.dtype == BF16
    torch.testing.assert_close(out.double(), expected.to(BF16).double(), rtol=2.0**-7, atol=1e-5)


def test_torch_paths_convert_between_the_cache_and_the_model_dtype() -> None:
    """Without kernels (float64 model, bfloat16 cache): writes round to the cache's dtype,
    decode attention reads it back in the query's."""
    key = torch.randn(3, 1, 8, dtype=torch.float64)
    k_cache = torch.zeros(2, 2, 1, 8, dtype=BF16)
    _custom_ops.reshape_and_cache(key, key, k_cache, k_cache.clone(), torch.tensor([0, 1, 2]))
    assert torch.equal(k_cache.view(-1, 8)[:3], key.view(3, 8).to(BF16))
    query = torch.randn(1, 1, 8, dtype=torch.float64)
    tables, lens = torch.tensor([[0, 1]], dtype=torch.int32), torch.tensor([3], dtype=torch.int32)
    out = _custom_ops.paged_decode_attention(query, k_cache, k_cache, tables, lens, 3, 0.3)
    assert out.dtype == torch.float64


@pytest.fixture
def kernel_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names pagedllm._C is asked for during the test: proof the kernel ran (a torch
    fallback would equal its own reference trivially)."""
    asked: list[str] = []
    c_module = _cpu_kernels._C

    class Counting:
        def __getattr__(self, name: str) -> object:
            asked.append(name)
            return getattr(c_module, name)

    monkeypatch.setattr(_cpu_kernels, "_C", Counting())
    return asked


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.int16)


def _bf16_steps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """How many bfloat16 values lie between a and b, elementwise (0 when equal, -0 == 0)."""

    def ordered(x: torch.Tensor) -> torch.Tensor:
        i = x.view(torch.int16).int()
        return torch.where(i < 0, -(i & 0x7FFF), i)

    return (ordered(a) - ordered(b)).abs()


def _exactly_summed(*shape: int) -> torch.Tensor:
    """bf16 multiples of 1/8 up to 1.5: their squares, and every partial sum of them, are exact
    in float32, so the mean of squares is the same in any summation order."""
    return (torch.randint(-12, 13, shape) / 8).to(BF16)


NORM_SIZES = [(1, 576), (3, 20), (200, 100), (2, 7)]


@needs_kernels
@pytest.mark.parametrize("rows,hidden", NORM_SIZES)
def test_rms_norm_bf16_is_the_torch_definition_bit_for_bit(
    rows: int, hidden: int, kernel_calls: list[str]
) -> None:
    """Reference: _torch_ops.rms_norm and fused_add_rms_norm on the same bf16 tensors, bit
    for bit: x + residual rounded, x * rsqrt(...) rounded before the weight, the product
    rounded. Sums of squares exact in any order (see _exactly_summed), so the kernel's
    summation order cannot show; 200 rows spread over threads, 20, 100, 7 leave tails."""
    x, residual = _exactly_summed(rows, hidden), _exactly_summed(rows, hidden)
    weight = torch.randn(hidden).to(BF16)
    out = _custom_ops.rms_norm(x, weight, 1e-6)
    assert out.dtype == BF16
    assert torch.equal(_bits(out), _bits(_torch_ops.rms_norm(x, weight, 1e-6)))
    fused = _custom_ops.fused_add_rms_norm(x, residual, weight, 1e-5)
    expected = _torch_ops.fused_add_rms_norm(x, residual, weight, 1e-5)
    for actual, want in zip(fused, expected, strict=True):
        assert torch.equal(_bits(actual), _bits(want))
    assert kernel_calls == ["rms_norm", "fused_add_rms_norm"]


@needs_kernels
@pytest.mark.parametrize("rows,hidden", NORM_SIZES)
def test_rms_norm_bf16_on_random_rows_is_torch_up_to_its_summation_order(
    rows: int, hidden: int
) -> None:
    """On random rows the kernel sums squares in another order than torch's reduction, so
    rsqrt(mean) may differ in its last float bits and move a rounding of x * rsqrt(...) by one
    bf16 step (two after the weight's product; measured: 12 of 131k outputs at n = 2048, none
    at 576); the new residual stays bit for bit."""
    x, residual = torch.randn(rows, hidden).to(BF16), torch.randn(rows, hidden).to(BF16)
    weight = torch.randn(hidden).to(BF16)
    assert (
        _bf16_steps(_custom_ops.rms_norm(x, weight, 1e-6), _torch_ops.rms_norm(x, weight, 1e-6))
        <= 2
    ).all()
    out, residual_out = _custom_ops.fused_add_rms_norm(x, residual, weight, 1e-5)
    expected, expected_residual = _torch_ops.fused_add_rms_norm(x, residual, weight, 1e-5)
    assert torch.equal(_bits(residual_out), _bits(expected_residual))
    assert (_bf16_steps(out, expected) <= 2).all()


@needs_kernels
@pytest.mark.parametrize("rows,hidden", NORM_SIZES)
def test_layer_norm_bf16_is_the_torch_definition_up_to_a_step(
    rows: int, hidden: int, kernel_calls: list[str]
) -> None:
    """Reference: _torch_ops.layer_norm and fused_add_layer_norm (F.layer_norm) on the same
    bf16 tensors: both compute in float32 and round once, summing in their own orders, so an
    output may differ by one bf16 step where its float32 value lies near a rounding boundary
    (measured: 3 of 20k); the new residual is bit for bit."""
    x, residual = torch.randn(rows, hidden).to(BF16), torch.randn(rows, hidden).to(BF16)
    weight, bias = torch.randn(hidden).to(BF16), torch.randn(hidden).to(BF16)
    out = _custom_ops.layer_norm(x, weight, bias, 1e-5)
    assert out.dtype == BF16
    assert (_bf16_steps(out, _torch_ops.layer_norm(x, weight, bias, 1e-5)) <= 1).all()
    out, residual_out = _custom_ops.fused_add_layer_norm(x, residual, weight, bias, 1e-5)
    expected, expected_residual = _torch_ops.fused_add_layer_norm(x, residual, weight, bias, 1e-5)
    assert torch.equal(_bits(residual_out), _bits(expected_residual))
    assert (_bf16_steps(out, expected) <= 1).all()
    assert kernel_calls == ["layer_norm", "fused_add_layer_norm"]


@needs_kernels
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_bf16_is_the_torch_definition_up_to_a_step(
    approximate: str, kernel_calls: list[str]
) -> None:
    """Reference: _torch_ops.gelu (F.gelu) on bf16, rounded once from float32 by both: one
    bf16 step at most where the last float bits differ (measured: 0.1% of the tanh form's
    outputs, none of the erf form's), and within 2^-7 relative plus 1e-6 below -3 (as
    gelu_and_mul's)."""
    x = torch.linspace(-12, 12, 70 * 1000).view(70, 1000).to(BF16)
    out = _custom_ops.gelu(x, approximate)
    expected = _torch_ops.gelu(x, approximate)
    assert out.dtype == BF16
    large = x > -3
    steps = _bf16_steps(out, expected)[large]
    assert (steps <= 1).all() and (steps > 0).float().mean() < 2e-3
    small, want = out.float()[~large], expected.float()[~large]
    assert ((small - want).abs() <= 2.0**-7 * want.abs() + 1e-6).all()
    assert kernel_calls == ["gelu"]


@needs_kernels
@pytest.mark.parametrize("num_tokens,d", [(1, 1536), (3, 7), (70, 1000)])
def test_silu_and_mul_bf16_is_the_torch_definition_up_to_exp(
    num_tokens: int, d: int, kernel_calls: list[str]
) -> None:
    """Reference: _torch_ops.silu_and_mul on bf16 (F.silu rounds silu(gate) to bf16, the
    product rounds again). The kernel's e^x may differ from torch's in the last float bit,
    which can move silu's rounding by one bf16 step (two after the product; measured: none of
    460k outputs differ); gates within +-80, inside the kernel's e^x range."""
    x = (torch.randn(num_tokens, 2 * d) * 8).clamp(-80, 80).to(BF16)
    out = _custom_ops.silu_and_mul(x)
    expected = _torch_ops.silu_and_mul(x)
    assert out.dtype == BF16 and out.shape == expected.shape
    assert (_bf16_steps(out, expected) <= 2).all()
    assert kernel_calls == ["silu_and_mul"]


@needs_kernels
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("num_tokens,d", [(1, 1536), (3, 7), (70, 1000)])
def test_gelu_and_mul_bf16_is_the_torch_definition_up_to_a_step(
    num_tokens: int, d: int, approximate: str, kernel_calls: list[str]
) -> None:
    """Reference: _torch_ops.gelu_and_mul on bf16 (F.gelu rounds gelu(gate) to bf16, the
    product rounds again), gates over +-12 on a grid, and +-1e4. The kernel's gelu differs
    from torch's float32 one in the last float bits, which can move its rounding by one bf16
    step (measured: 28 of 44k outputs of the tanh form; without the rounding of gelu, far
    more). Below -3, where gelu(gate) is under 0.004, torch's float32 gelu loses its low bits
    (up to ~1e-6 absolute) and the kernel's does not: there within 2^-7 relative plus 1e-5
    of |up|."""
    gate = torch.linspace(-12, 12, num_tokens * d).view(num_tokens, d)
    gate[0, :2] = torch.tensor([1e4, -1e4])
    x = torch.cat([gate, torch.randn(num_tokens, d)], dim=-1).to(BF16)
    out = _custom_ops.gelu_and_mul(x, approximate)
    expected = _torch_ops.gelu_and_mul(x, approximate)
    assert out.dtype == BF16 and out.shape == expected.shape
    large = x[:, :d] > -3
    steps = _bf16_steps(out, expected)[large]
    assert (steps <= 1).all() and (steps > 0).float().mean() < 1e-3
    small, want, up = (t.float()[~large] for t in (out, expected, x[:, d:]))
    assert ((small - want).abs() <= 2.0**-7 * want.abs() + 1e-5 * up.abs()).all()
    assert kernel_calls == ["gelu_and_mul"]


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, BF16])
@pytest.mark.parametrize("num_tokens,n", [(1, 576), (5, 7), (40, 1000)])
def test_lora_masked_add_is_the_torch_definition_bit_for_bit(
    dtype: torch.dtype, num_tokens: int, n: int, kernel_calls: list[str]
) -> None:
    """Reference: _torch_ops.lora_masked_add (torch's y + delta, rounded once in bf16, on the
    rows of the slot; y's rows, signed zeros included, elsewhere)."""
    y = torch.randn(num_tokens, n).to(dtype)
    y[:, 0] = -0.0
    delta = torch.randn(num_tokens, n).to(dtype)
    row_slots = torch.randint(-1, 3, (num_tokens,), dtype=torch.int32)
    row_slots[0] = 1
    for slot in (-1, 0, 1, 2):
        out = _custom_ops.lora_masked_add(y, delta, row_slots, slot)
        expected = _torch_ops.lora_masked_add(y, delta, row_slots, slot)
        assert out.dtype == dtype and torch.equal(out.view(torch.uint8), expected.view(torch.uint8))
    assert set(kernel_calls) == {"lora_masked_add"}
    assert not torch.equal(_custom_ops.lora_masked_add(y, delta, row_slots, 1)[0], y[0])


@needs_kernels
@pytest.mark.parametrize("is_neox_style", [True, False])
@pytest.mark.parametrize("head_size,rotary_dim", [(64, 64), (80, 40), (8, 8), (72, 72)])
@pytest.mark.parametrize("num_tokens", [1, 40])
def test_rotary_embedding_bf16_is_the_torch_definition_bit_for_bit(
    is_neox_style: bool,
    head_size: int,
    rotary_dim: int,
    num_tokens: int,
    kernel_calls: list[str],
) -> None:
    """Reference: _torch_ops.rotary_embedding on the same bf16 column slices of one fused qkv
    row (strided rows, as the attention layer passes them), bit for bit: each product
    rounded to float32, the sum rounded to bf16, lanes past rotary_dim copied. 72 leaves a
    NeoX half (36) past the 16-lane loop; 40 tokens spread over threads."""
    num_heads, num_kv_heads = 4, 2
    q_size, kv_size = num_heads * head_size, num_kv_heads * head_size
    qkv = torch.randn(num_tokens, q_size + 2 * kv_size).to(BF16)
    before = qkv.clone()
    q, k, _ = qkv.split([q_size, kv_size, kv_size], dim=-1)
    cos_sin = torch.randn(1000, rotary_dim)
    positions = torch.randint(0, 1000, (num_tokens,))
    args = (positions, q, k, head_size, cos_sin, is_neox_style)
    out = _custom_ops.rotary_embedding(*args)
    for actual, want in zip(out, _torch_ops.rotary_embedding(*args), strict=True):
        assert actual.dtype == BF16 and actual.is_contiguous()
        assert torch.equal(_bits(actual), _bits(want))
    assert torch.equal(_bits(qkv), _bits(before))
    assert kernel_calls == ["rotary_embedding"]


@needs_kernels
def test_bf16_ops_with_a_float32_tensor_run_the_torch_definition(
    kernel_calls: list[str],
) -> None:
    """A norm weight or a rope query in another dtype than x's is no kernel call: torch's
    own type promotion decides the result."""
    x, weight = torch.randn(3, 16).to(BF16), torch.randn(16)
    assert torch.equal(_custom_ops.rms_norm(x, weight, 1e-6), _torch_ops.rms_norm(x, weight, 1e-6))
    q, k, cos_sin = torch.randn(2, 16), torch.randn(2, 8).to(BF16), torch.randn(8, 8)
    args = (torch.tensor([0, 5]), q, k, 8, cos_sin, True)
    for actual, want in zip(
        _custom_ops.rotary_embedding(*args), _torch_ops.rotary_embedding(*args), strict=True
    ):
        assert torch.equal(actual, want)
    assert kernel_calls == []


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, BF16])
@pytest.mark.parametrize("shape", [(1, 576), (5, 7), (3, 40000)])
def test_scale_and_add_are_the_torch_definitions_bit_for_bit(
    dtype: torch.dtype, shape: tuple[int, int], kernel_calls: list[str]
) -> None:
    """Reference: torch's x * alpha and a + b (in bf16 from float32, rounded once), signed
    zeros and infinities included; (3, 40000) takes the threads' chunks."""
    a = torch.randn(shape).to(dtype)
    b = torch.randn(shape).to(dtype)
    a[0, :3] = torch.tensor([-0.0, float("inf"), 3e38]).to(dtype)
    for alpha in (0.22, 12.0, -1.0 / 3):
        out = _custom_ops.scale(a, alpha)
        assert out.dtype == dtype and torch.equal(
            out.view(torch.uint8), (a * alpha).view(torch.uint8)
        )
    out = _custom_ops.add(a, b)
    assert torch.equal(out.view(torch.uint8), (a + b).view(torch.uint8))
    assert set(kernel_calls) == {"scale", "add"}
