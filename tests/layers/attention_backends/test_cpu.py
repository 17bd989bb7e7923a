"""The pagedllm._C backend against the torch reference backend on the same batches and
caches; both against dense attention; and each of its rows against that row computed
alone."""

from collections.abc import Callable

import pytest
import torch

from pagedllm import _cpu_kernels
from pagedllm.forward_context import AttentionMetadata, set_forward_context
from pagedllm.layers.attention_backends.cpu import CpuAttentionBackend
from pagedllm.layers.attention_backends.torch_sdpa import TorchSdpaBackend
from tests.layers.paged_attention_steps import (
    HEAD_CONFIGS,
    HEAD_SIZE,
    build_metadata,
    make_attention,
    make_seqs,
    step_and_check,
)


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("num_heads,num_kv_heads", HEAD_CONFIGS)
def test_cpu_backend_matches_the_reference_backend(
    num_heads: int, num_kv_heads: int, block_size: int
) -> None:
    """Reference: TorchSdpaBackend on copies of the same caches, step after step (mixed
    prefill/decode, then decodes); caches bit-identical, outputs within 1e-5."""
    cpu = make_attention(num_heads, num_kv_heads, block_size)
    ref = make_attention(num_heads, num_kv_heads, block_size)
    assert isinstance(cpu.backend, CpuAttentionBackend)
    ref.backend = TorchSdpaBackend()
    seqs = make_seqs([14, 32, 7], cpu, block_size, seed=num_heads)
    for num_new in ([11, 17, 4], [1, 13, 1], [1, 1, 1], [1, 1, 1]):
        metadata = build_metadata(seqs, num_new, block_size)
        rows = [s.num_computed for s in seqs]
        qkv = torch.cat(
            [torch.cat([s.q, s.k, s.v], 1)[r : r + n] for s, r, n in zip(seqs, rows, num_new)]
        )
        q_size, kv_size = num_heads * HEAD_SIZE, num_kv_heads * HEAD_SIZE
        q, k, v = qkv.split([q_size, kv_size, kv_size], dim=1)
        with set_forward_context(metadata):
            out, expected = cpu(q, k, v), ref(q, k, v)
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
        for mine, theirs in zip(cpu.kv_cache, ref.kv_cache, strict=True):
            assert torch.equal(mine, theirs)
        for seq, n in zip(seqs, num_new, strict=True):
            seq.num_computed += n


def test_cpu_backend_matches_dense_attention() -> None:
    """Reference: dense attention (step_and_check), a prompt in chunks then decodes."""
    attn = make_attention(8, 2, 16)
    (seq,) = make_seqs([40], attn, 16, seed=5)
    for n in [17, 20, 1, 1, 1]:
        step_and_check(attn, [seq], [n], 16)


def test_cpu_backend_runs_the_kernels_for_writes_prefills_and_decodes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Reference: the kernel names pagedllm._C is asked for (a recorder stands in for it):
    a prefill step writes and attends through kernels, a decode step too."""
    called: list[str] = []

    class Recorder:
        def __getattr__(self, name: str) -> Callable[..., None]:
            called.append(name)
            return lambda *args: None

    attn = make_attention(4, 2, 4)
    (seq,) = make_seqs([4], attn, 4, seed=1)
    monkeypatch.setattr(_cpu_kernels, "_C", Recorder())
    for n, expected in [
        (3, ["reshape_and_cache", "prefill_attention_f32"]),
        (1, ["reshape_and_cache", "paged_decode_attention"]),
    ]:
        qkv = torch.cat([seq.q, seq.k, seq.v], 1)[seq.num_computed : seq.num_computed + n]
        q, k, v = qkv.split([4 * HEAD_SIZE, 2 * HEAD_SIZE, 2 * HEAD_SIZE], dim=1)
        with set_forward_context(build_metadata([seq], [n], 4)):
            attn(q, k, v)
        assert called == expected
        called.clear()
        seq.num_computed += n


def _step(steps: list[tuple[int, int]], block_tables: torch.Tensor) -> AttentionMetadata:
    """The metadata of a step of sequences with (cached tokens, new tokens) each, on
    block_tables [B, max_blocks] (the slots it names are never written here)."""
    block_size = 16
    slots = [
        int(block_tables[i, pos // block_size]) * block_size + pos % block_size
        for i, (ctx, n) in enumerate(steps)
        for pos in range(ctx, ctx + n)
    ]
    query_lens = [n for _, n in steps]
    seq_lens = [ctx + n for ctx, n in steps]
    return AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        query_start_loc=torch.tensor([0, *query_lens]).cumsum(0).to(torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=block_tables,
        query_lens_cpu=query_lens,
        seq_lens_cpu=seq_lens,
    )


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_each_row_of_a_mixed_step_is_the_bits_of_that_token_alone(
    dtype: torch.dtype, cache_dtype: torch.dtype
) -> None:
    """Reference: the same backend on a step that decodes the one token (what a prefix-cache
    hit on a whole prompt computes for its last token, or a decode). Decodes and prefill
    chunks in one step: fresh, after cached context, across the 512-key partitions."""
    steps = [(699, 1), (3, 20), (4, 1), (490, 40), (0, 17)]  # (cached, new) per sequence
    num_heads, num_kv_heads, head_size, max_blocks = 9, 3, 64, 47
    shape = (len(steps) * max_blocks, 16, num_kv_heads, head_size)
    k_cache, v_cache = torch.randn(shape).to(cache_dtype), torch.randn(shape).to(cache_dtype)
    tables = torch.randperm(shape[0]).view(len(steps), max_blocks).to(torch.int32)
    query = torch.randn(sum(n for _, n in steps), num_heads, head_size).to(dtype)
    backend = CpuAttentionBackend()
    out = backend.forward(query, k_cache, v_cache, _step(steps, tables), 0.125)
    row = 0
    for i, (ctx, n) in enumerate(steps):
        for pos in range(ctx, ctx + n):
            alone = _step([(pos, 1)], tables[i : i + 1])
            expected = backend.forward(query[row : row + 1], k_cache, v_cache, alone, 0.125)
            assert torch.equal(out[row], expected[0]), (i, pos)
            row += 1


def test_the_cpu_backend_never_falls_back_to_torch_per_call() -> None:
    """A float16 query, which only torch's path takes, is an error here: the selector chose
    this backend for float32 and bf16 models, and what it chose is what runs."""
    attn = make_attention(4, 2, 4)
    (seq,) = make_seqs([4], attn, 4, seed=1)
    qkv = torch.cat([seq.q, seq.k, seq.v], 1)[:3].half()
    q, k, v = qkv.split([4 * HEAD_SIZE, 2 * HEAD_SIZE, 2 * HEAD_SIZE], dim=1)
    with set_forward_context(build_metadata([seq], [3], 4)), pytest.raises(ValueError):
        attn(q, k, v)
