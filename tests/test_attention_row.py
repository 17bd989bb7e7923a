"""csrc/attention_row.h's promise: a query's attention output is the same bits whichever
kernel computes it, decode attention (one sequence of L tokens, in a batch of any size) or
prefill attention (row i of a chunk after ctx cached tokens, L = ctx + i + 1, in a chunk
of any size), on every build, for float32 and bf16 caches and queries, any head size, GQA,
and queries past one partition of 512 keys, with and without a sliding window and a logit
soft cap. Reference: paged_decode_attention itself, held to the torch definition in
test_custom_ops.py and test_custom_ops_bf16.py."""

import pytest
import torch

from pagedllm import _custom_ops

SCALE = 0.2
PROMPT = 1300  # three partitions of 512 keys, the last one short

SHAPES = [  # (num_heads, num_kv_heads, head_size, block_size)
    (9, 3, 64, 16),  # the default model's
    (16, 2, 128, 16),
    (12, 2, 96, 16),
    (4, 1, 80, 8),  # AVX-512: a head of one chain per lane (80 % 32 != 0); elsewhere two
    (8, 8, 40, 5),  # AVX-512 and AVX2: elements past the last whole vector, on lane 0
    (6, 2, 24, 1),
    (2, 1, 256, 16),  # the largest head widened and kept in registers
    (3, 1, 300, 16),  # past it: one chain per lane, values summed one element at a time
]

CHUNKS = [(1, 0), (5, 0), (20, 3), (40, 490), (30, 1270)]
"""(queries, cached context): one query, a short chunk, one across the first 16-key block,
one across the first 512-key partition, one in the third partition."""


OPTIONS = [  # (sliding_window, logits_soft_cap)
    (1, 0.0),  # one key
    (7, 0.0),  # inside a 16-key block, starting anywhere in one
    (300, 0.0),  # across blocks; equal to the context of the 300th position
    (600, 0.0),  # across the 512-key partitions, which start at the window
    (0, 5.0),
    (600, 2.0),
]
WINDOW_CHUNKS = [*CHUNKS, (12, 294), (600, 700)]
"""CHUNKS, and chunks whose rows see their whole context and then a sliding window (300),
and of rows past two partitions of one (600)."""


def _prompt(
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    block_size: int,
    cache_dtype: torch.dtype,
    query_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(queries [PROMPT, H, D], k_cache, v_cache, block_table) of one prompt on scattered
    blocks; queries of norm ~3, so that softmaxes are not flat."""
    num_blocks = PROMPT // block_size + 8
    shape = (num_blocks, block_size, num_kv_heads, head_size)
    k_cache, v_cache = torch.randn(shape).to(cache_dtype), torch.randn(shape).to(cache_dtype)
    table = torch.randperm(num_blocks)[: -(-PROMPT // block_size) + 1].to(torch.int32)
    query = (3 * torch.randn(PROMPT, num_heads, head_size) / head_size**0.5).to(query_dtype)
    return query, k_cache, v_cache, table


def _decoded(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    table: torch.Tensor,
    ctx: int,
    *options: float,
) -> torch.Tensor:
    """Each row i of query [n, H, D] decoded as the new token of a sequence of ctx + i + 1
    tokens, all in one batch (options: sliding_window, logits_soft_cap)."""
    n = query.shape[0]
    seq_lens = torch.arange(ctx + 1, ctx + n + 1, dtype=torch.int32)
    tables = table.expand(n, -1).contiguous()
    return _custom_ops.paged_decode_attention(
        query, k_cache, v_cache, tables, seq_lens, ctx + n, SCALE, *options
    )


def _check_rows_against_decodes(
    prompt: tuple[torch.Tensor, ...], chunks: list[tuple[int, int]], *options: float
) -> None:
    """Each chunk's rows against their decodes, in one batch and (the last row) alone."""
    query, k_cache, v_cache, table = prompt
    for n, ctx in chunks:
        q = query[ctx : ctx + n]
        out = _custom_ops.prefill_attention(q, k_cache, v_cache, table, ctx + n, SCALE, *options)
        assert out.dtype == query.dtype
        assert torch.equal(out, _decoded(q, k_cache, v_cache, table, ctx, *options)), (n, ctx)
        alone = _decoded(q[-1:], k_cache, v_cache, table, ctx + n - 1, *options)
        assert torch.equal(out[-1:], alone), (n, ctx)


@pytest.mark.parametrize("query_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_heads,num_kv_heads,head_size,block_size", SHAPES)
def test_a_prefill_row_is_the_bits_of_its_decode(
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    block_size: int,
    cache_dtype: torch.dtype,
    query_dtype: torch.dtype,
    attention_row_isa: str,
) -> None:
    """Each chunk's rows against their decodes, in one batch and (the last row) alone."""
    prompt = _prompt(num_heads, num_kv_heads, head_size, block_size, cache_dtype, query_dtype)
    _check_rows_against_decodes(prompt, CHUNKS)


@pytest.mark.parametrize("sliding_window,logits_soft_cap", OPTIONS)
@pytest.mark.parametrize("query_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_heads,num_kv_heads,head_size,block_size", SHAPES)
def test_a_prefill_row_is_the_bits_of_its_decode_in_a_window_or_capped(
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    block_size: int,
    cache_dtype: torch.dtype,
    query_dtype: torch.dtype,
    sliding_window: int,
    logits_soft_cap: float,
    attention_row_isa: str,
) -> None:
    """As above with a sliding window (of 1 key to more than a partition; windows start at any
    key, and both kernels partition a query's keys from its window's first), a soft cap
    (one tanh for both kernels), or both."""
    prompt = _prompt(num_heads, num_kv_heads, head_size, block_size, cache_dtype, query_dtype)
    _check_rows_against_decodes(prompt, WINDOW_CHUNKS, sliding_window, logits_soft_cap)


@pytest.mark.parametrize("options", [(), (300, 0.0), (600, 5.0)])
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
def test_prefill_rows_do_not_depend_on_their_chunk(
    cache_dtype: torch.dtype, options: tuple[int, float], attention_row_isa: str
) -> None:
    """The prompt in one chunk, or in chunks that end anywhere (inside a 16-key block, at and
    next to the 512-key partitions, one token at a time): each position's output is the
    same bits, without options, in a sliding window, and in one with a soft cap."""
    query, k_cache, v_cache, table = _prompt(9, 3, 64, 16, cache_dtype, torch.float32)

    def chunks(bounds: list[int]) -> torch.Tensor:
        return torch.cat(
            [
                _custom_ops.prefill_attention(
                    query[a:b], k_cache, v_cache, table, b, SCALE, *options
                )
                for a, b in zip(bounds, bounds[1:])
            ]
        )

    whole = chunks([0, PROMPT])
    for bounds in ([0, 16, 600, PROMPT], [0, 511, 513, 1024, 1025, PROMPT], [0, 7, 8, 9, PROMPT]):
        assert torch.equal(chunks(bounds), whole), bounds
