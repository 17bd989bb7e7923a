"""Attention over the paged KV cache; reference: dense causal attention
softmax(Q K^T * scale + causal mask) V over each whole sequence, kv heads expanded."""

import pytest
import torch

from pagedllm.layers.attention import Attention
from tests.layers.paged_attention_steps import (
    HEAD_CONFIGS,
    HEAD_SIZE,
    SCALE,
    make_attention,
    make_seqs,
    step_and_check,
)


@pytest.fixture(autouse=True)
def _both_paths(cpu_kernels: str) -> None:
    """Decodes run through pagedllm._C's paged kernel, or torch: both against dense."""


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("num_heads,num_kv_heads", HEAD_CONFIGS)
def test_mixed_batch_matches_dense_reference(
    num_heads: int, num_kv_heads: int, block_size: int
) -> None:
    """Fresh prefill, prefill chunk after cached context and decodes in one batch."""
    attn = make_attention(num_heads, num_kv_heads, block_size)
    fresh, chunked, dec_long, dec_short, dec_one = make_seqs(
        [8, 24, 22, 7, 3], attn, block_size, seed=num_heads + block_size
    )
    step_and_check(attn, [chunked, dec_long, dec_short, dec_one], [17, 20, 5, 1], block_size)
    mixed = [dec_long, fresh, dec_short, chunked, dec_one]
    step_and_check(attn, mixed, [1, 7, 1, 6, 1], block_size)
    everyone = [fresh, chunked, dec_long, dec_short, dec_one]
    step_and_check(attn, everyone, [1, 1, 1, 1, 1], block_size)


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("num_heads,num_kv_heads", HEAD_CONFIGS)
def test_chunked_prefill_then_decode_matches_dense_reference(
    num_heads: int, num_kv_heads: int, block_size: int
) -> None:
    """A prompt in 3 chunks, then 5 decodes; each step against attention over the prefix."""
    attn = make_attention(num_heads, num_kv_heads, block_size)
    (seq,) = make_seqs([23], attn, block_size, seed=7)
    for n in [5, 6, 7, 1, 1, 1, 1, 1]:
        step_and_check(attn, [seq], [n], block_size)


def test_forward_without_kv_cache_raises() -> None:
    attn = Attention(4, HEAD_SIZE, SCALE, 2)
    q, kv = torch.zeros(1, 4 * HEAD_SIZE), torch.zeros(1, 2 * HEAD_SIZE)
    with pytest.raises(RuntimeError, match="kv_cache is None"):
        attn(q, kv, kv)


@pytest.mark.parametrize("num_kv_heads", [0, 3])
def test_num_kv_heads_must_divide_num_heads(num_kv_heads: int) -> None:
    with pytest.raises(ValueError, match=f"num_kv_heads {num_kv_heads}"):
        Attention(8, HEAD_SIZE, SCALE, num_kv_heads)


def test_layer_asks_the_selector_once_at_construction(cpu_kernels: str) -> None:
    """Reference: get_attn_backend for the default device and dtype: the pagedllm._C backend
    for float32 CPU when the extension is there, else the torch reference."""
    attn = Attention(4, HEAD_SIZE, SCALE, 2)
    assert attn.backend.name == ("CPU_ATTN" if cpu_kernels == "pagedllm._C" else "TORCH_SDPA")
    assert f"backend={attn.backend.name}" in repr(attn)
