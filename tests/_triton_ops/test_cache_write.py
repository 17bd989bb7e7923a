"""The Triton cache write (pagedllm/_triton_ops/cache_write.py) on a GPU, else under Triton's
interpreter.
Reference: _torch_ops.reshape_and_cache on copies of the same caches."""

import pytest
import torch

from pagedllm import _torch_ops


@pytest.mark.parametrize(
    "block_size,num_kv_heads,head_size,dtype,cache_dtype",
    [
        (16, 2, 64, torch.float32, torch.float32),
        (32, 1, 128, torch.bfloat16, torch.bfloat16),
        (16, 4, 64, torch.float16, torch.float16),
        (32, 2, 64, torch.bfloat16, torch.float32),
        (16, 2, 64, torch.bfloat16, torch.float8_e4m3fn),
        (16, 2, 64, torch.float32, torch.float8_e4m3fn),
    ],
)
def test_the_cache_write_matches_the_reference(
    triton_device: torch.device,
    block_size: int,
    num_kv_heads: int,
    head_size: int,
    dtype: torch.dtype,
    cache_dtype: torch.dtype,
) -> None:
    """Slots scattered over blocks, one ending a block and one mid-block; the qkv split's
    strided key and value; caches bit-identical to the reference's."""
    from pagedllm._triton_ops.cache_write import reshape_and_cache

    gen = torch.Generator().manual_seed(block_size + num_kv_heads)
    num_tokens, row = 5, num_kv_heads * head_size
    qkv = torch.randn(num_tokens, 3 * row, generator=gen).to(triton_device, dtype)
    key, value = (x.view(num_tokens, num_kv_heads, head_size) for x in qkv[:, row:].split(row, 1))
    shape = (6, block_size, num_kv_heads, head_size)
    k_cache, v_cache = (
        torch.randn(shape, generator=gen).to(triton_device, cache_dtype) for _ in range(2)
    )
    slots = torch.tensor(
        [3 * block_size + 2, block_size - 1, 0, 5 * block_size + 7, 2 * block_size],
        device=triton_device,
    )
    expected = k_cache.clone(), v_cache.clone()
    _torch_ops.reshape_and_cache(key, value, *expected, slots)
    reshape_and_cache(key, value, k_cache, v_cache, slots)
    for cache, reference in zip((k_cache, v_cache), expected, strict=True):
        assert torch.equal(cache.view(torch.uint8), reference.view(torch.uint8))


def test_a_negative_slot_is_skipped(triton_device: torch.device) -> None:
    """vLLM's padded rows: slot -1 writes nothing (reference: the caches before)."""
    from pagedllm._triton_ops.cache_write import reshape_and_cache

    key = torch.randn(3, 2, 64, device=triton_device)
    k_cache, v_cache = (torch.zeros(2, 16, 2, 64, device=triton_device) for _ in range(2))
    reshape_and_cache(key, key, k_cache, v_cache, torch.tensor([-1, 17, -1], device=triton_device))
    assert torch.equal(k_cache.view(-1, 2, 64)[17], key[1])
    assert k_cache.count_nonzero() == key[1].count_nonzero()
    assert torch.equal(k_cache, v_cache)


@pytest.mark.parametrize("layout", ["one head, any stride", "heads transposed"])
def test_keys_dense_by_row_are_read_in_place_and_others_copied(
    triton_device: torch.device, layout: str
) -> None:
    """A single head's stride is never stepped along (pagedllm/tensor_layout.py), so such a
    key is read as it is; a key whose rows are not dense is copied first. Reference:
    _torch_ops.reshape_and_cache."""
    from pagedllm._triton_ops.cache_write import reshape_and_cache

    if layout == "one head, any stride":
        base = torch.randn(3 * 16, device=triton_device)
        key = base.as_strided((3, 1, 16), (16, 99, 1))
    else:
        key = torch.randn(3, 16, 2, device=triton_device).transpose(1, 2)
    shape = (2, 16, *key.shape[1:])
    k_cache, v_cache = (torch.zeros(shape, device=triton_device) for _ in range(2))
    expected = k_cache.clone(), v_cache.clone()
    slots = torch.tensor([5, 16, 2], device=triton_device)
    _torch_ops.reshape_and_cache(key, key, *expected, slots)
    reshape_and_cache(key, key, k_cache, v_cache, slots)
    assert torch.equal(k_cache, expected[0]) and torch.equal(v_cache, expected[1])
