"""_custom_ops runs pagedllm._C's kernels on CPU float32 tensors; reference: their torch
definitions (F.linear, the formulas, and _torch_ops' paged attention, itself tested against
dense attention), which it runs everywhere else."""

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pagedllm import _cpu_kernels, _custom_ops, _torch_ops, _triton_ops
from pagedllm._custom_ops import common
from pagedllm.layers.linear import ColumnParallelLinear
from pagedllm.layers.quantization.base_config import LayerKind
from pagedllm.layers.quantization.unquantized import (
    UnquantizedEmbeddingMethod,
    UnquantizedLinearMethod,
)


def test_extension_is_built() -> None:
    """make install builds pagedllm._C; without it every test below would check F.linear
    against itself."""
    assert _custom_ops.has_cpu_kernels(), "pagedllm._C is missing: pip install -e . needs gcc"


@pytest.mark.parametrize("num_rows", [0, 1, 2, 3, 4, 5, 9, 13, 40, 300])
@pytest.mark.parametrize("in_features", [5, 16, 100, 576])
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_matches_f_linear(
    num_rows: int, in_features: int, with_bias: bool, skinny_gemm_isa: str
) -> None:
    """Every row count takes the kernel: tiles of up to 4 rows by 4, 2 or 1 weight rows
    (AVX-512, AVX2, portable), one weight row at a time for the columns past the last whole
    tile (37 outputs) and where K is not a multiple of the vector width (5, and 100 but on the
    portable build); the AVX2 build's panels of 16 weight rows where K is a multiple of 8.
    Reference: F.linear in float64, up to float32 rounding."""
    w = torch.randn(37, in_features)
    b = torch.randn(37) if with_bias else None
    x = torch.randn(num_rows, in_features)
    expected = F.linear(x.double(), w.double(), None if b is None else b.double())
    torch.testing.assert_close(_custom_ops.linear(x, w, b), expected.float(), rtol=1e-5, atol=5e-5)


@pytest.mark.parametrize("num_rows", [1, 5, 17, 23, 130])
@pytest.mark.parametrize("out_features", [16, 37, 48])
@pytest.mark.parametrize("in_features", [8, 100, 576, 1032])
@pytest.mark.parametrize("with_bias", [False, True])
def test_skinny_gemm_on_plain_and_packed_weights_matches_f_linear(
    num_rows: int, out_features: int, in_features: int, with_bias: bool, skinny_gemm_isa: str
) -> None:
    """The AVX2 build multiplies whole panels of 16 weight rows as outer products, in chunks
    of up to 512 values of K (1032: three of 344), over a transposed copy of a plain weight
    or skinny_pack's panels as they are (the same bits), and the rest of the columns (37: 5)
    as dot-product tiles, as does any K that is not a multiple of 8 (100); the other builds
    keep their tiles. Reference: F.linear in float64, up to float32 rounding."""
    w = torch.randn(out_features, in_features)
    b = torch.randn(out_features) if with_bias else None
    x = torch.randn(num_rows, in_features)
    expected = F.linear(x.double(), w.double(), None if b is None else b.double())
    got = _cpu_kernels.skinny_gemm(x, w, b)
    torch.testing.assert_close(got, expected.float(), rtol=1e-5, atol=1e-4)
    if _cpu_kernels.skinny_packable(w) and _cpu_kernels.skinny_gemm_reads_packed(torch.float32):
        assert torch.equal(_cpu_kernels.skinny_gemm(x, _cpu_kernels.skinny_pack(w), b), got)


def test_skinny_packing_of_float32_is_panels_of_16_rows_k_by_k() -> None:
    """skinny_pack on float32: per 16 weight rows, each k's 16 values side by side (the
    avx2 build's outer products read them front to back); _torch_ops.unpack_skinny gives
    the weight back."""
    w = torch.randn(32, 24)
    packed = _cpu_kernels.skinny_pack(w)
    assert packed.shape == (2, 24, 16)
    for panel, k in ((0, 0), (1, 23), (0, 9)):
        assert torch.equal(packed[panel, k], w[16 * panel : 16 * panel + 16, k])
    assert torch.equal(_torch_ops.unpack_skinny(packed), w)
    with pytest.raises(ValueError, match=r"needs N % 16 == 0 and K % 8 == 0"):
        _cpu_kernels.skinny_pack(torch.randn(16, 12))


BATCH_ROWS = [*range(1, 301), 512, 1000, 2048]
"""The row counts a row of linear() is multiplied among: every decode batch and prefill chunk
up to 300, and larger chunks."""


def _row_in_every_batch(linear: Callable[[torch.Tensor], torch.Tensor], row: torch.Tensor) -> None:
    """linear(x) [M, N] gives `row` [K] the same bits as first and as last of M rows, for every
    M in BATCH_ROWS, the other rows random (so tiles, panels, blocks of rows and their tails
    all cut through the batch at different places). Reference: linear(row) alone."""
    alone = linear(row[None])[0]
    others = torch.randn(2 * max(BATCH_ROWS), row.shape[0]).to(row.dtype)
    for m in BATCH_ROWS:
        x = others[m : 2 * m].clone()
        x[0] = x[-1] = row
        y = linear(x)
        assert torch.equal(y[0], alone) and torch.equal(y[-1], alone), f"M = {m}"


@pytest.fixture
def skinny_build(skinny_gemm_isa: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """skinny_gemm_isa on a CPU without AMX tiles (test_custom_ops_bf16.py tests those)."""
    monkeypatch.setattr(_cpu_kernels, "amx_available", lambda: False)
    return skinny_gemm_isa


def _linear_layer(weight: torch.Tensor, method: UnquantizedLinearMethod) -> nn.Module:
    """A layer holding weight, processed as the model loader processes it."""
    layer = nn.Module()
    layer.weight = nn.Parameter(weight, requires_grad=False)
    layer.quant_kind, layer.tied = LayerKind.LM_HEAD, True
    method.process_weights_after_loading(layer)
    return layer


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("out_features,in_features", [(48, 576), (37, 100), (64, 1032)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_gives_a_row_the_same_bits_in_every_batch(
    dtype: torch.dtype, out_features: int, in_features: int, with_bias: bool, skinny_build: str
) -> None:
    """Batch invariance on each build, float32 and bf16: through the linear method on its
    weight as process_weights_after_loading leaves it (packed in the order the build reads,
    for whole blocks), including K that is no multiple of the vector width (100) and columns
    past the last whole tile or panel (37)."""
    method = UnquantizedLinearMethod()
    layer = _linear_layer(torch.randn(out_features, in_features).to(dtype), method)
    bias = torch.randn(out_features).to(dtype) if with_bias else None
    _row_in_every_batch(lambda x: method.apply(layer, x, bias), torch.randn(in_features).to(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tied_lm_head_gives_a_row_the_same_bits_in_every_batch(
    dtype: torch.dtype, skinny_build: str
) -> None:
    """A tied LM head keeps the embedding's rows and, where its layout differs, a packed
    copy (packed_weight) that linear() multiplies for every row count: batch-invariant on
    each build, and within float32 rounding of F.linear on the embedding."""
    method = UnquantizedEmbeddingMethod()
    embedding = torch.randn(1024, 64).to(dtype)
    head = _linear_layer(embedding, method)
    assert head.weight is not None and torch.equal(head.weight, embedding)
    packed = getattr(head, "packed_weight", None)
    assert (packed is not None) == _cpu_kernels.skinny_gemm_reads_packed(dtype)
    x = torch.randn(9, 64).to(dtype)
    expected = F.linear(x.double(), embedding.double()).to(dtype)
    torch.testing.assert_close(method.apply(head, x), expected, rtol=1e-2, atol=1e-3)
    _row_in_every_batch(lambda x: method.apply(head, x), torch.randn(64).to(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1, 2, 5])
def test_rms_norm_reads_per_head_rows_of_a_qkv_slice_in_place(
    dtype: torch.dtype, tokens: int
) -> None:
    """Qwen3's q/k norm: [T, heads, D] views of a fused qkv's column slices (rows D apart
    within a token, the qkv width between tokens) normalize to the bits of their contiguous
    copies, and the kernel reads them in place (no copy is made: a launch, no torch op)."""
    qkv = torch.randn(tokens, 4 * 32 + 2 * 2 * 32).to(dtype)
    weight = torch.randn(32).to(dtype)
    views = (
        qkv[:, :128].view(tokens, 4, 32),
        qkv[:, 128:192].view(tokens, 2, 32),
        qkv[:, :128].view(tokens, 2, 2, 32),  # rows dense within each token at any depth
    )
    for view in views:
        expected = _custom_ops.rms_norm(view.contiguous(), weight, 1e-6)
        with _cpu_kernels.record_launches() as launches:
            out = _custom_ops.rms_norm(view, weight, 1e-6)
        assert torch.equal(out, expected) and out.is_contiguous()
        assert [launch.args[1] for launch in launches] == [view.data_ptr()]
    for strided in (  # rows not dense: copied first
        torch.randn(3, 8, 32).to(dtype).transpose(0, 1),
        torch.randn(3, 2, 4, 32).to(dtype).transpose(0, 1),  # last two dims dense, not dim 1
    ):
        assert torch.equal(
            _custom_ops.rms_norm(strided, weight, 1e-6),
            _custom_ops.rms_norm(strided.contiguous(), weight, 1e-6),
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("width", [1, 15, 16, 17, 100, 49152])
def test_argmax_is_torch_argmax_ties_nan_and_infinities_included(
    width: int, dtype: torch.dtype
) -> None:
    """The first largest index, the first NaN's where a row holds one, -inf rows; rows of
    every width around the 16-element vector and a 49k vocabulary; a strided view falls
    back to torch. bfloat16 rows give the argmax of their float32 values."""
    rows = torch.randn(9, width).to(dtype)
    rows[1] = 3.0  # all tied: index 0
    rows[2, width // 2 :] = rows[2].max() + 1  # tied maxima: the first of them
    rows[3] = -float("inf")
    rows[4, -1] = float("nan")
    rows[5, width // 3] = float("nan")
    rows[6, 0] = float("inf")
    rows[7, -1] = float("inf")
    rows[8] = torch.arange(width, dtype=torch.float32)  # the maximum last
    assert torch.equal(_custom_ops.argmax(rows), rows.float().argmax(dim=-1))
    assert torch.equal(_custom_ops.argmax(rows[:0]), rows[:0].argmax(dim=-1))
    strided = torch.randn(width, 3).to(dtype).t()
    assert torch.equal(_custom_ops.argmax(strided), strided.argmax(dim=-1))


def test_linear_keeps_leading_dims_and_reads_strided_input() -> None:
    """Reference: F.linear on a 1-D input and on a transposed (non-contiguous) 3-D input."""
    w = torch.randn(24, 40)
    x1 = torch.randn(40)
    torch.testing.assert_close(_custom_ops.linear(x1, w), F.linear(x1, w))
    x3 = torch.randn(40, 2, 1).permute(1, 2, 0)
    assert not x3.is_contiguous()
    out = _custom_ops.linear(x3, w)
    assert out.shape == (2, 1, 24)
    torch.testing.assert_close(out, F.linear(x3, w))


@pytest.mark.parametrize(
    "dtype,requires_grad", [(torch.float32, True), (torch.float64, False), (torch.float16, False)]
)
def test_linear_falls_back_to_torch_where_the_kernel_does_not_apply(
    dtype: torch.dtype, requires_grad: bool
) -> None:
    """Other dtypes and autograd go to F.linear itself: bit-identical results."""
    w = torch.randn(8, 16, dtype=dtype, requires_grad=requires_grad)
    x = torch.randn(2, 16, dtype=dtype)
    assert torch.equal(_custom_ops.linear(x, w), F.linear(x, w))


def test_linear_without_the_extension_is_f_linear(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_cpu_kernels, "_C", None)
    w, x = torch.randn(8, 16), torch.randn(1, 16)
    assert torch.equal(_custom_ops.linear(x, w), F.linear(x, w))


def _torch_decode(query, k_cache, v_cache, block_tables, seq_lens, scale, *options):
    """The torch definition's padded-gather decode, in float64 (options: sliding_window,
    logits_soft_cap)."""
    out = _torch_ops.paged_decode_attention(
        query.double(),
        k_cache.double(),
        v_cache.double(),
        block_tables,
        seq_lens,
        int(seq_lens.max()),
        scale,
        *options,
    )
    return out.float()


@pytest.mark.parametrize(
    "num_heads,num_kv_heads,head_size,block_size",
    [
        (9, 3, 64, 16),
        (8, 8, 24, 4),
        (4, 1, 80, 1),
        (16, 2, 128, 16),
        (2, 2, 8, 5),
        (12, 2, 96, 16),
        (5, 1, 256, 8),
        (4, 2, 32, 16),
    ],
)
@pytest.mark.parametrize("scale", [0.125, 4.0])
def test_paged_decode_attention_matches_torch_backend(
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    block_size: int,
    scale: float,
    attention_isa: str,
) -> None:
    """Scattered block tables, lengths from 1 to 1,300 (partial last blocks, the 4-, 8- or
    16-key chunks' tails; past 512 tokens a sequence is attended in partitions of 512 and
    merged: 513, 700 and 1,300 are 2, 2 and 3 of them, the last one short); scale 4 makes
    the softmax peaked, so e^x meets inputs far below -87. Head sizes that are multiples of
    twice the build's vector width (32 on AVX-512, 16 on AVX2, 8 portable) take the kernel's
    grouped path (query heads per kv head 1-8: groups of 4, 2 and 1 left over), the others
    its per-head path."""
    num_blocks = 1400 // block_size + 60
    cache_shape = (num_blocks, block_size, num_kv_heads, head_size)
    k_cache, v_cache = torch.randn(cache_shape), torch.randn(cache_shape)
    seq_lens = torch.tensor([1, 17, 700, 33, 1300, 512, 513], dtype=torch.int32)
    max_blocks = -(-1300 // block_size) + 2
    block_tables = torch.stack([torch.randperm(num_blocks)[:max_blocks] for _ in seq_lens]).to(
        torch.int32
    )
    query = torch.randn(len(seq_lens), num_heads, head_size)
    out = _custom_ops.paged_decode_attention(
        query, k_cache, v_cache, block_tables, seq_lens, 1300, scale
    )
    expected = _torch_decode(query, k_cache, v_cache, block_tables, seq_lens, scale)
    # A float32 score's rounding grows with scale * |q| |k| (~ scale * sqrt(D) here), and the
    # output's with it: up to 2.3e-5 seen at scale 4, D 256 (AVX2's summing order), 1e-7 at 1/8.
    atol = max(2e-5, 2e-6 * scale * head_size**0.5)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=atol)


@pytest.mark.parametrize(
    "num_heads,num_kv_heads,head_size,block_size",
    [(9, 3, 64, 16), (4, 1, 80, 1), (2, 2, 8, 5), (5, 1, 256, 8)],
)
@pytest.mark.parametrize(
    "sliding_window,logits_soft_cap",
    [(1, 0.0), (5, 0.0), (40, 0.0), (512, 0.0), (600, 0.0), (0, 3.0), (0, 50.0), (600, 3.0)],
)
def test_paged_decode_attention_in_a_window_or_capped_matches_torch_backend(
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    block_size: int,
    sliding_window: int,
    logits_soft_cap: float,
    attention_isa: str,
) -> None:
    """Reference: the float64 torch definition with the window (the last sliding_window keys)
    and the soft cap (cap * tanh(s / cap)): windows of 1 key to more than a partition, shorter
    and longer than the sequences (1 to 1,300 tokens); caps that flatten the scores (3) and that
    barely touch them (50); both. Scale 1, so that the caps bite."""
    num_blocks = 1400 // block_size + 60
    cache_shape = (num_blocks, block_size, num_kv_heads, head_size)
    k_cache, v_cache = torch.randn(cache_shape), torch.randn(cache_shape)
    seq_lens = torch.tensor([1, 17, 700, 33, 1300, 512, 513], dtype=torch.int32)
    max_blocks = -(-1300 // block_size) + 2
    block_tables = torch.stack([torch.randperm(num_blocks)[:max_blocks] for _ in seq_lens]).to(
        torch.int32
    )
    query = torch.randn(len(seq_lens), num_heads, head_size)
    options = (sliding_window, logits_soft_cap)
    out = _custom_ops.paged_decode_attention(
        query, k_cache, v_cache, block_tables, seq_lens, 1300, 1.0, *options
    )
    expected = _torch_decode(query, k_cache, v_cache, block_tables, seq_lens, 1.0, *options)
    atol = max(2e-5, 2e-6 * head_size**0.5)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=atol)


@pytest.mark.parametrize(
    "seq_len,rise_per_key",
    [(300, 0.05), (300, 0.7), (300, 3.0), (300, -3.0), (1100, 0.05), (1100, 0.3), (1100, -0.3)],
)
def test_paged_decode_attention_stays_exact_as_scores_climb(
    seq_len: int, rise_per_key: float, attention_isa: str
) -> None:
    """Head 0's scores climb (or fall) steadily along 300 keys: 0.05 to 3 per key, so
    the softmax is peaked at the last (or the first) key and e^(s - max) underflows for most;
    along 1,100 keys (three partitions, merged) the last (or the first) partition outweighs
    the others, by scores up to 330 (a float32 score's rounding grows with it); the result
    must equal the float64 definition's."""
    head_size, block_size = 64, 16
    query = torch.randn(1, 2, head_size)
    direction = query[0, 0] / query[0, 0].square().sum()  # query . direction = 1
    positions = torch.arange(seq_len, dtype=torch.float32)[:, None]
    keys = rise_per_key * positions * direction + 0.01 * torch.randn(seq_len, head_size)
    num_blocks = seq_len // block_size + 1
    k_cache = torch.zeros(num_blocks * block_size, 1, head_size)
    k_cache[:seq_len, 0] = keys
    k_cache = k_cache.view(num_blocks, block_size, 1, head_size)
    v_cache = torch.randn(num_blocks, block_size, 1, head_size)
    block_tables = torch.arange(num_blocks, dtype=torch.int32)[None]
    seq_lens = torch.tensor([seq_len], dtype=torch.int32)
    out = _custom_ops.paged_decode_attention(
        query, k_cache, v_cache, block_tables, seq_lens, seq_len, 1.0
    )
    expected = _torch_decode(query, k_cache, v_cache, block_tables, seq_lens, 1.0)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
def test_paged_decode_attention_rows_do_not_depend_on_their_batch(
    cache_dtype: torch.dtype, attention_isa: str
) -> None:
    """A sequence's output is the same bits alone (its kv heads in separate tasks, 1,300
    tokens in three partitions) as among five others (all kv heads in one task): captured
    decode steps pad batches and must equal eager ones."""
    num_blocks, block_size = 120, 16
    shape = (num_blocks, block_size, 3, 64)
    k_cache, v_cache = torch.randn(shape).to(cache_dtype), torch.randn(shape).to(cache_dtype)
    seq_lens = torch.tensor([1300, 5, 600, 64, 1, 200], dtype=torch.int32)
    tables = torch.stack([torch.randperm(num_blocks)[:83] for _ in seq_lens]).to(torch.int32)
    query = torch.randn(len(seq_lens), 9, 64)
    batch = _custom_ops.paged_decode_attention(
        query, k_cache, v_cache, tables, seq_lens, 1300, 0.125
    )
    for i in (0, 2):
        alone = _custom_ops.paged_decode_attention(
            query[i : i + 1], k_cache, v_cache, tables[i : i + 1], seq_lens[i : i + 1], 1300, 0.125
        )
        assert torch.equal(alone[0], batch[i])


def _prefill_case(
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    seq_len: int,
    block_size: int,
    cache_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(float32 queries for all seq_len positions, k_cache, v_cache, block_table) on
    scattered blocks."""
    num_blocks = seq_len // block_size + 8
    shape = (num_blocks, block_size, num_kv_heads, head_size)
    k_cache, v_cache = torch.randn(shape).to(cache_dtype), torch.randn(shape).to(cache_dtype)
    table = torch.randperm(num_blocks)[: -(-seq_len // block_size) + 1].to(torch.int32)
    return torch.randn(seq_len, num_heads, head_size), k_cache, v_cache, table


@pytest.mark.parametrize(
    "num_heads,num_kv_heads,head_size,block_size",
    [(9, 3, 64, 16), (4, 2, 80, 8), (8, 8, 16, 1), (16, 2, 128, 16), (2, 1, 24, 5), (2, 1, 300, 7)],
)
@pytest.mark.parametrize(
    "num_queries,seq_len",
    [(1, 1), (2, 2), (13, 13), (20, 45), (1, 70), (16, 600), (300, 300), (9, 1100)],
)
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
def test_prefill_attention_f32_is_the_causal_definition(
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    block_size: int,
    num_queries: int,
    seq_len: int,
    cache_dtype: torch.dtype,
    prefill_f32_isa: str,
) -> None:
    """Reference: the float64 torch definition (causal, bottom-right aligned after cached
    context) on the same cache values. Head sizes of decode's two recipes (widened: 64, 128;
    per head: 80 and 16 on AVX-512, 24 with elements past the last vector, 300 past 256),
    chunks of 1-300 queries (tasks of 4 or 6 queries of a kv head, the last one short),
    partial key blocks, queries past 512 keys (partitions merged), a bf16 cache (widened
    exactly)."""
    query, k_cache, v_cache, table = _prefill_case(
        num_heads, num_kv_heads, head_size, seq_len, block_size, cache_dtype
    )
    query = query[seq_len - num_queries :]
    out = _cpu_kernels.prefill_attention_f32(query, k_cache, v_cache, table, seq_len, 0.2)
    expected = _torch_ops.prefill_attention(
        query.double(), k_cache.double(), v_cache.double(), table, seq_len, 0.2
    )
    assert out.dtype == torch.float32 and out.shape == query.shape
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize(
    "num_heads,num_kv_heads,head_size,block_size", [(9, 3, 64, 16), (4, 2, 80, 8), (2, 1, 24, 5)]
)
@pytest.mark.parametrize("num_queries,seq_len", [(1, 70), (20, 45), (300, 300), (40, 1100)])
@pytest.mark.parametrize(
    "sliding_window,logits_soft_cap",
    [(1, 0.0), (7, 0.0), (30, 0.0), (600, 0.0), (0, 3.0), (600, 3.0)],
)
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
def test_prefill_attention_f32_in_a_window_or_capped_is_the_definition(
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    block_size: int,
    num_queries: int,
    seq_len: int,
    sliding_window: int,
    logits_soft_cap: float,
    cache_dtype: torch.dtype,
    prefill_f32_isa: str,
) -> None:
    """Reference: the float64 torch definition, causal and within the sliding window (rows in
    a tile start their windows at different keys), scores capped; windows of 1 key to more
    than a partition, shorter and longer than the context; scale 1, so that the cap bites."""
    query, k_cache, v_cache, table = _prefill_case(
        num_heads, num_kv_heads, head_size, seq_len, block_size, cache_dtype
    )
    query = query[seq_len - num_queries :]
    options = (sliding_window, logits_soft_cap)
    out = _cpu_kernels.prefill_attention_f32(query, k_cache, v_cache, table, seq_len, 1.0, *options)
    expected = _torch_ops.prefill_attention(
        query.double(), k_cache.double(), v_cache.double(), table, seq_len, 1.0, *options
    )
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=2e-5)


def test_kernels_apply_only_to_cpu_float32_without_autograd(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    x = torch.zeros(2, 8)
    assert _custom_ops.cpu_kernels_apply(x, None, torch.zeros(8))
    assert not _custom_ops.cpu_kernels_apply(x, x.double())
    assert not _custom_ops.cpu_kernels_apply(x, x.to(torch.bfloat16))
    bf16 = (torch.float32, torch.bfloat16)
    assert _custom_ops.cpu_kernels_apply(x, x.to(torch.bfloat16), dtypes=bf16)
    assert not _custom_ops.cpu_kernels_apply(x, torch.zeros(8, requires_grad=True))
    with torch.no_grad():
        assert _custom_ops.cpu_kernels_apply(x, torch.zeros(8, requires_grad=True))
    monkeypatch.setattr(_cpu_kernels, "_C", None)
    assert not _custom_ops.cpu_kernels_apply(x)


def test_triton_kernels_apply_only_to_cuda_tensors_of_one_float_dtype() -> None:
    x = torch.zeros(2, 8)
    assert not common.triton_kernels_apply(x, torch.zeros(8))
    if not torch.cuda.is_available() or not _triton_ops.has_triton():
        return
    cuda = x.to("cuda", torch.bfloat16)
    assert common.triton_kernels_apply(cuda, torch.zeros(8, device="cuda", dtype=torch.bfloat16))
    assert not common.triton_kernels_apply(cuda, torch.zeros(8, device="cuda"))
    assert not common.triton_kernels_apply(cuda, x)
    assert not common.triton_kernels_apply(cuda.double())


@pytest.mark.parametrize("value, expected", [("triton", True), (" Torch", False)])
def test_the_environment_picks_the_row_wise_kernels_of_cuda_tensors(
    monkeypatch: pytest.MonkeyPatch, value: str, expected: bool
) -> None:
    monkeypatch.setenv(common.ROWWISE_KERNELS_ENV, value)
    common.rowwise_triton.cache_clear()
    try:
        assert common.rowwise_triton() is (expected and _triton_ops.has_triton())
        monkeypatch.setenv(common.ROWWISE_KERNELS_ENV, "cuda")
        common.rowwise_triton.cache_clear()
        with pytest.raises(ValueError, match='PAGEDLLM_ROWWISE_KERNELS must be "triton" or'):
            common.rowwise_triton()
    finally:
        common.rowwise_triton.cache_clear()


def _rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.double()
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.double()).float()


@pytest.mark.parametrize("rows,hidden", [(1, 576), (3, 20), (200, 100)])
def test_rms_norm_and_fused_add_match_the_formula(rows: int, hidden: int) -> None:
    """Reference: x * rsqrt(mean(x^2) + eps) * w in float64; fused: the same of x + residual.
    200 rows of 100 split over threads; 20 and 100 leave a tail past the 16-lane loop."""
    x, residual, weight = torch.randn(rows, hidden), torch.randn(rows, hidden), torch.randn(hidden)
    tol = {"rtol": 1e-5, "atol": 1e-5}
    torch.testing.assert_close(
        _custom_ops.rms_norm(x, weight, 1e-6), _rms_norm_reference(x, weight, 1e-6), **tol
    )
    out, residual_out = _custom_ops.fused_add_rms_norm(x, residual, weight, 1e-5)
    torch.testing.assert_close(residual_out, x + residual, rtol=0, atol=0)
    torch.testing.assert_close(out, _rms_norm_reference(x + residual, weight, 1e-5), **tol)


def _layer_norm_reference(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float
) -> torch.Tensor:
    x = x.double()
    centered = x - x.mean(-1, keepdim=True)
    rstd = torch.rsqrt(centered.pow(2).mean(-1, keepdim=True) + eps)
    return (centered * rstd * weight.double() + bias.double()).float()


@pytest.mark.parametrize("offset", [0.0, 100.0])
@pytest.mark.parametrize("rows,hidden", [(1, 576), (3, 20), (200, 100)])
def test_layer_norm_and_fused_add_match_the_formula(rows: int, hidden: int, offset: float) -> None:
    """Reference: (x - mean) * rsqrt(var + eps) * w + b in float64 (torch's nn.LayerNorm);
    fused: the same of x + residual. Rows of N(0, 1) to 1e-5; rows offset by 100 to 1e-4, the
    float32 rounding of their mean (torch's F.layer_norm is off by up to 3e-5 there), where a
    one-pass variance, mean(x^2) - mean^2, would be off by ~1e-3."""
    x = torch.randn(rows, hidden) + offset
    residual, weight, bias = torch.randn(rows, hidden), torch.randn(hidden), torch.randn(hidden)
    tol = {"rtol": 0, "atol": 1e-4 if offset else 1e-5}
    out = _custom_ops.layer_norm(x, weight, bias, 1e-5)
    torch.testing.assert_close(out, _layer_norm_reference(x, weight, bias, 1e-5), **tol)
    out, residual_out = _custom_ops.fused_add_layer_norm(x, residual, weight, bias, 1e-5)
    torch.testing.assert_close(residual_out, x + residual, rtol=0, atol=0)
    expected = _layer_norm_reference(x + residual, weight, bias, 1e-5)
    torch.testing.assert_close(out, expected, **tol)


def _rotate_reference(x, cos_sin, positions, head_size, is_neox_style):
    """The rotation formula on [T, heads * head_size] in float64; lanes past rotary_dim kept."""
    rotary_dim = cos_sin.shape[1]
    heads = x.double().reshape(x.shape[0], -1, head_size)
    cos, sin = cos_sin[positions].double()[:, None].chunk(2, dim=-1)
    rot = heads[..., :rotary_dim]
    if is_neox_style:
        x1, x2 = rot.chunk(2, dim=-1)
        rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    else:
        x1, x2 = rot[..., ::2], rot[..., 1::2]
        rotated = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
    return torch.cat((rotated, heads[..., rotary_dim:]), dim=-1).reshape(x.shape).float()


@pytest.mark.parametrize("is_neox_style", [True, False])
@pytest.mark.parametrize("head_size,rotary_dim", [(64, 64), (80, 40), (8, 8)])
@pytest.mark.parametrize("num_tokens", [1, 40])
def test_rotary_embedding_matches_the_formula_on_fused_qkv_slices(
    is_neox_style: bool, head_size: int, rotary_dim: int, num_tokens: int
) -> None:
    """q and k are column slices of one qkv row (strided rows), as the attention layer passes
    them; outputs are new tensors and the inputs stay as they were."""
    num_heads, num_kv_heads = 4, 2
    q_size, kv_size = num_heads * head_size, num_kv_heads * head_size
    qkv = torch.randn(num_tokens, q_size + 2 * kv_size)
    before = qkv.clone()
    q, k, _ = qkv.split([q_size, kv_size, kv_size], dim=-1)
    cos_sin = torch.randn(1000, rotary_dim)
    positions = torch.randint(0, 1000, (num_tokens,))
    q_out, k_out = _custom_ops.rotary_embedding(positions, q, k, head_size, cos_sin, is_neox_style)
    expected_q = _rotate_reference(q, cos_sin, positions, head_size, is_neox_style)
    expected_k = _rotate_reference(k, cos_sin, positions, head_size, is_neox_style)
    torch.testing.assert_close(q_out, expected_q, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k_out, expected_k, rtol=1e-5, atol=1e-5)
    assert torch.equal(qkv, before)


@pytest.mark.parametrize("num_tokens,d", [(1, 1536), (3, 7), (70, 1000)])
def test_silu_and_mul_matches_the_formula(num_tokens: int, d: int) -> None:
    """Reference: gate * sigmoid(gate) * up in float64, with gates out to +-120 where e^x
    must not overflow; d = 7 is all tail, 70 x 1000 spreads over threads."""
    x = torch.randn(num_tokens, 2 * d) * 30
    x[0, :2] = torch.tensor([120.0, -120.0])
    gate, up = x.double().chunk(2, dim=-1)
    expected = (gate * torch.sigmoid(gate) * up).float()
    torch.testing.assert_close(_custom_ops.silu_and_mul(x), expected, rtol=1e-5, atol=1e-5)


def _gelu_inputs(num_tokens: int, d: int) -> torch.Tensor:
    """[num_tokens, 2d]: gates out to +-30 on a grid (every width's tail), +-120 and
    +-1e4 where e^x must not overflow, ups N(0, 1)."""
    gate = torch.linspace(-30, 30, num_tokens * d).view(num_tokens, d)
    gate[0, :4] = torch.tensor([120.0, -120.0, 1e4, -1e4])[: min(d, 4)]
    return torch.cat([gate, torch.randn(num_tokens, d)], dim=-1)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("num_tokens,d", [(1, 1536), (3, 7), (70, 1000)])
def test_gelu_and_mul_matches_the_formula(num_tokens: int, d: int, approximate: str) -> None:
    """Reference: _torch_ops.gelu_and_mul (F.gelu(gate) * up) in float64, to a few float32
    ulps and 1e-7 absolute (where gelu is tiny: below -2 its relative error grows as erfc's
    conditioning, like any float32 evaluation's); d = 7 is all tail, 70 x 1000 spreads over
    threads. torch's own float32 GELU is further off there (up to ~1e-6 absolute)."""
    x = _gelu_inputs(num_tokens, d)
    out = _custom_ops.gelu_and_mul(x, approximate)
    expected = _torch_ops.gelu_and_mul(x.double(), approximate).float()
    torch.testing.assert_close(out, expected, rtol=5e-7, atol=1e-7)
    torch.testing.assert_close(out, _torch_ops.gelu_and_mul(x, approximate), rtol=1e-6, atol=2e-6)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_and_mul_passes_nan_on(approximate: str) -> None:
    """Reference: F.gelu's NaN for a NaN gate, and NaN times any gelu for a NaN up."""
    x = torch.randn(2, 2 * 17)
    x[0, 3], x[1, 17 + 16] = float("nan"), float("nan")
    out = _custom_ops.gelu_and_mul(x, approximate)
    assert out.isnan().nonzero().tolist() == [[0, 3], [1, 16]]


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("num_tokens,d", [(1, 1536), (3, 7), (70, 1000)])
def test_gelu_matches_the_formula(num_tokens: int, d: int, approximate: str) -> None:
    """Reference: F.gelu in float64, to a few float32 ulps and 1e-7 absolute (as
    gelu_and_mul's); 7 is all tail, 70 x 1000 elements spread over threads; NaN passes on."""
    x = _gelu_inputs(num_tokens, d)[:, :d].contiguous()
    x[-1, -1] = float("nan")
    out = _custom_ops.gelu(x, approximate)
    expected = _torch_ops.gelu(x.double(), approximate).float()
    torch.testing.assert_close(out, expected, rtol=5e-7, atol=1e-7, equal_nan=True)
    torch.testing.assert_close(
        out, _torch_ops.gelu(x, approximate), rtol=1e-6, atol=2e-6, equal_nan=True
    )


def _op_inputs(dtype: torch.dtype) -> dict[str, tuple]:
    """Arguments of each dispatched op (besides linear), in one dtype."""
    x, residual, weight = (torch.randn(3, 16, dtype=dtype) for _ in range(3))
    qkv = torch.randn(2, 4 * 8 + 2 * 2 * 8, dtype=dtype)
    q, k, _ = qkv.split([32, 16, 16], dim=-1)
    cache = torch.randn(6, 4, 2, 8, dtype=dtype)
    tables = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    seq_lens = torch.tensor([5, 8], dtype=torch.int32)
    return {
        "rms_norm": (x, weight[0], 1e-6),
        "fused_add_rms_norm": (x, residual, weight[0], 1e-6),
        "layer_norm": (x, weight[0], weight[1], 1e-5),
        "fused_add_layer_norm": (x, residual, weight[0], weight[1], 1e-5),
        "gelu": (x, "tanh"),
        "silu_and_mul": (x,),
        "gelu_and_mul": (x, "tanh"),
        "rotary_embedding": (torch.tensor([0, 7]), q, k, 8, torch.randn(8, 8), True),
        "paged_decode_attention": (
            torch.randn(2, 4, 8, dtype=dtype),
            cache,
            cache + 1,
            tables,
            seq_lens,
            8,
            0.5,
        ),
    }


OPS = ["rms_norm", "fused_add_rms_norm", "silu_and_mul", "gelu_and_mul", "rotary_embedding"]
OPS += ["layer_norm", "fused_add_layer_norm", "gelu", "paged_decode_attention"]


def _tensors(out: torch.Tensor | tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    return out if isinstance(out, tuple) else (out,)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_where_no_kernel_applies_each_op_is_its_torch_definition(
    op: str, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reference: _torch_ops, bit for bit, for float64 (no kernel) and for float32 without
    the extension."""
    if dtype == torch.float32:
        monkeypatch.setattr(_cpu_kernels, "_C", None)
    args = _op_inputs(dtype)[op]
    out, expected = getattr(_custom_ops, op)(*args), getattr(_torch_ops, op)(*args)
    for actual, want in zip(_tensors(out), _tensors(expected), strict=True):
        assert torch.equal(actual, want)


@pytest.mark.parametrize("op", OPS)
def test_float32_cpu_ops_run_the_kernel_close_to_the_torch_definition(
    op: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reference: _torch_ops on the same inputs, within float32 rounding; the kernel's name
    is what pagedllm._C was asked for."""
    asked = []

    class Counting:
        def __getattr__(self, name: str) -> object:
            asked.append(name)
            return getattr(_C, name)

    _C = _cpu_kernels._C
    monkeypatch.setattr(_cpu_kernels, "_C", Counting())
    args = _op_inputs(torch.float32)[op]
    out = getattr(_custom_ops, op)(*args)
    torch.testing.assert_close(out, getattr(_torch_ops, op)(*args), rtol=1e-5, atol=1e-5)
    assert asked == [op]


def test_the_linear_kernel_is_chosen_from_the_weight_as_loaded(monkeypatch) -> None:
    """select_linear_kernel: skinny_gemm for CPU float32 / bf16 weights, plain or packed;
    AMX tiles where prepack made them; torch for float16, other devices and no extension."""
    kinds = _custom_ops.LinearKernel
    weight = torch.randn(64, 64)
    packed = _custom_ops.prepack_linear_weight(weight.bfloat16())
    expected_bf16 = kinds.AMX if _cpu_kernels.amx_available() else kinds.SKINNY
    assert _custom_ops.select_linear_kernel(weight) is kinds.SKINNY
    assert _custom_ops.select_linear_kernel(packed) is expected_bf16
    assert _custom_ops.select_linear_kernel(weight.half()) is kinds.TORCH
    assert _custom_ops.select_linear_kernel(weight.to("meta")) is kinds.TORCH
    monkeypatch.setattr(_cpu_kernels, "_C", None)
    assert _custom_ops.select_linear_kernel(weight) is kinds.TORCH


def test_a_chosen_kernel_runs_and_raises_on_what_it_cannot_take() -> None:
    """With the layer's kernel given, linear() runs it: float16 activations against a
    float32 weight chosen for skinny_gemm raise, where a call that chooses takes torch's path."""
    weight, x = torch.randn(32, 64), torch.randn(3, 64)
    kernel = _custom_ops.select_linear_kernel(weight)
    assert torch.equal(_custom_ops.linear(x, weight, kernel=kernel), _custom_ops.linear(x, weight))
    with pytest.raises(ValueError):
        _custom_ops.linear(x.half(), weight, kernel=kernel)
    torch.testing.assert_close(
        _custom_ops.linear(x.half(), weight.half()), F.linear(x.half(), weight.half())
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_loaded_layer_keeps_its_kernel(dtype: torch.dtype) -> None:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        layer = ColumnParallelLinear(64, 32)
    finally:
        torch.set_default_dtype(previous)
    assert layer.linear_kernel is None
    layer.quant_method.process_weights_after_loading(layer)
    assert layer.linear_kernel is _custom_ops.select_linear_kernel(layer.weight)
    assert layer.linear_kernel is not _custom_ops.LinearKernel.TORCH
