"""_custom_ops on bfloat16 tensors: skinny_gemm_bf16 for decode-sized matmuls, KV-cache
writes and decode attention on a bfloat16 cache. References: F.linear in float64 rounded
once to bfloat16, torch's own conversions (bit for bit), and the float64 torch definition of
paged attention on the same bfloat16 values."""

import pytest
import torch
import torch.nn.functional as F

from pagedllm import _custom_ops, _torch_ops

BF16 = torch.bfloat16
needs_kernels = pytest.mark.skipif(not _custom_ops.has_cpu_kernels(), reason="no pagedllm._C")


def _bf16_linear_bound(x: torch.Tensor, w: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """One rounding to bfloat16 (half a unit in the last of 8 bits: 2^-8 relative) after a
    float32 sum (2^-20 of sum |x w|, generous for K up to a few thousand)."""
    return ref.abs() * 2.0**-8 + (x.double().abs() @ w.double().abs().T) * 2.0**-20


@needs_kernels
@pytest.mark.parametrize("num_rows", [0, 1, 2, 3, 4, 5, 9, 16])
@pytest.mark.parametrize("in_features", [5, 16, 100, 576])
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_bf16_is_f_linear_rounded_once(
    num_rows: int, in_features: int, with_bias: bool
) -> None:
    """Up to SKINNY_GEMM_BF16_MAX_ROWS rows (16) the kernel runs: within one bf16 rounding
    of the float64 product (37 outputs, K of 5 and 100 not a multiple of 16)."""
    w = torch.randn(37, in_features).to(BF16)
    b = torch.randn(37).to(BF16) if with_bias else None
    x = torch.randn(num_rows, in_features).to(BF16)
    ref = F.linear(x.double(), w.double(), None if b is None else b.double())
    out = _custom_ops.linear(x, w, b)
    assert out.dtype == BF16 and out.shape == (num_rows, 37)
    assert ((out.double() - ref).abs() <= _bf16_linear_bound(x, w, ref)).all()


@needs_kernels
def test_linear_bf16_rows_do_not_depend_on_their_batch() -> None:
    """Each row's result is bit-identical whether it runs alone or among 15 others: the
    kernel sums each dot product in one order whatever M is (batch invariance)."""
    w, x = torch.randn(300, 576).to(BF16), torch.randn(16, 576).to(BF16)
    batch = _custom_ops.linear(x, w)
    for i in range(16):
        assert torch.equal(_custom_ops.linear(x[i : i + 1], w)[0], batch[i])


@needs_kernels
def test_linear_bf16_past_the_kernel_rows_and_with_autograd_is_f_linear() -> None:
    w = torch.randn(24, 64).to(BF16)
    x = torch.randn(_custom_ops.SKINNY_GEMM_BF16_MAX_ROWS + 1, 64).to(BF16)
    assert torch.equal(_custom_ops.linear(x, w), F.linear(x, w))
    w_grad = w.clone().requires_grad_()
    assert torch.equal(_custom_ops.linear(x[:2], w_grad), F.linear(x[:2], w_grad))


def _special_values(shape: tuple[int, ...]) -> torch.Tensor:
    """Random floats plus values that test rounding: ties, NaN, infinities, the largest
    finite float32 (rounds to bf16 infinity), denormals."""
    x = torch.randn(shape)
    flat = x.view(-1)
    specials = [1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, float("nan"), float("inf"), -float("inf"),
                3.4028235e38, 1e-40, -0.0]  # fmt: skip
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
@pytest.mark.parametrize("num_heads,num_kv_heads,head_size", [(9, 3, 64), (4, 1, 80)])
def test_paged_decode_attention_on_a_bf16_cache(
    query_dtype: torch.dtype, num_heads: int, num_kv_heads: int, head_size: int
) -> None:
    """Reference: the float64 torch definition on the same (bf16-valued) cache and query,
    rounded to the query's dtype; lengths 1 to 300 over scattered blocks."""
    block_size, num_blocks = 16, 40
    shape = (num_blocks, block_size, num_kv_heads, head_size)
    k_cache, v_cache = torch.randn(shape).to(BF16), torch.randn(shape).to(BF16)
    seq_lens = torch.tensor([1, 17, 300, 33], dtype=torch.int32)
    tables = torch.stack([torch.randperm(num_blocks)[:20] for _ in seq_lens]).to(torch.int32)
    query = torch.randn(len(seq_lens), num_heads, head_size).to(query_dtype)
    out = _custom_ops.paged_decode_attention(query, k_cache, v_cache, tables, seq_lens, 300, 0.1)
    expected = _torch_ops.paged_decode_attention(
        query.double(), k_cache.double(), v_cache.double(), tables, seq_lens, 300, 0.1
    )
    assert out.dtype == query_dtype
    tolerance = (
        {"rtol": 2.0**-8, "atol": 1e-5} if query_dtype == BF16 else {"rtol": 1e-5, "atol": 2e-5}
    )
    torch.testing.assert_close(out.double(), expected.to(query_dtype).double(), **tolerance)


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
