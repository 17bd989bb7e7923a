"""The pagedllm._C backend against the torch reference backend on the same batches and
caches; both against dense attention."""

from collections.abc import Callable

import pytest
import torch

from pagedllm import _cpu_kernels
from pagedllm.forward_context import set_forward_context
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


def test_cpu_backend_runs_the_kernels_for_writes_and_decodes_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Reference: the kernel names pagedllm._C is asked for (a recorder stands in for it):
    a prefill step writes through the kernel and attends in torch, a decode step uses both."""
    called: list[str] = []

    class Recorder:
        def __getattr__(self, name: str) -> Callable[..., None]:
            called.append(name)
            return lambda *args: None

    attn = make_attention(4, 2, 4)
    (seq,) = make_seqs([4], attn, 4, seed=1)
    monkeypatch.setattr(_cpu_kernels, "_C", Recorder())
    for n, expected in [
        (3, ["reshape_and_cache"]),
        (1, ["reshape_and_cache", "paged_decode_attention"]),
    ]:
        qkv = torch.cat([seq.q, seq.k, seq.v], 1)[seq.num_computed : seq.num_computed + n]
        q, k, v = qkv.split([4 * HEAD_SIZE, 2 * HEAD_SIZE, 2 * HEAD_SIZE], dim=1)
        with set_forward_context(build_metadata([seq], [n], 4)):
            attn(q, k, v)
        assert called == expected
        called.clear()
        seq.num_computed += n
