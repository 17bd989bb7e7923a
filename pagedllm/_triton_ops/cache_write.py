"""The KV-cache write as one Triton kernel: _torch_ops.reshape_and_cache's contract.

One program per new token copies its KV * D keys and values into the slot
slot_mapping[t] = block_id * block_size + offset of caches [num_blocks, block_size, KV, D],
converting to the caches' dtype. A slot below 0 is skipped, as vLLM does for padded rows
(a CUDA graph's padding tokens).

Triton's interpreter rounds to float8 wrongly where rounding up carries into the exponent
(0.499 becomes 0.25), so under it a float8 cache's values are converted by torch first and
the kernel copies bytes.
"""

import torch
import triton
import triton.language as tl

from pagedllm._triton_ops import interpreting
from pagedllm.tensor_layout import with_dense_rows


@triton.jit
def _reshape_and_cache_kernel(
    key_ptr,
    value_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    stride_key,
    stride_value,
    stride_cache_block,
    stride_cache_slot,
    BLOCK_SIZE: tl.constexpr,
    ROW: tl.constexpr,  # KV * D
    ROW_PADDED: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:
        return
    dest = (slot // BLOCK_SIZE) * stride_cache_block + (slot % BLOCK_SIZE) * stride_cache_slot
    lanes = tl.arange(0, ROW_PADDED)
    valid = lanes < ROW
    key = tl.load(key_ptr + token * stride_key + lanes, mask=valid)
    value = tl.load(value_ptr + token * stride_value + lanes, mask=valid)
    tl.store(k_cache_ptr + dest + lanes, key.to(k_cache_ptr.dtype.element_ty), mask=valid)
    tl.store(v_cache_ptr + dest + lanes, value.to(v_cache_ptr.dtype.element_ty), mask=valid)


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Stores key/value [T, KV, D] in the caches [num_blocks, block_size, KV, D] at
    slot_mapping [T]; rows whose slot is negative are not written."""
    num_tokens = key.shape[0]
    if num_tokens == 0:
        return
    block_size, num_kv_heads, head_size = k_cache.shape[1:]
    row = num_kv_heads * head_size
    if k_cache.element_size() == 1 and interpreting():
        key, value = key.to(k_cache.dtype), value.to(v_cache.dtype)
    key, value = with_dense_rows(key), with_dense_rows(value)
    for cache in (k_cache, v_cache):
        if cache.stride()[2:] != (head_size, 1) or cache.stride() != k_cache.stride():
            raise ValueError("the caches must be [num_blocks, block_size, KV, D] with KV, D dense")
    _reshape_and_cache_kernel[(num_tokens,)](
        key,
        value,
        k_cache,
        v_cache,
        slot_mapping,
        key.stride(0),
        value.stride(0),
        k_cache.stride(0),
        k_cache.stride(1),
        BLOCK_SIZE=block_size,
        ROW=row,
        ROW_PADDED=triton.next_power_of_2(row),
    )
