"""_triton_ops.rotary.rotary_embedding against the torch definition (pagedllm/_torch_ops.py)."""

import pytest
import torch

pytest.importorskip("triton")

from pagedllm import _torch_ops  # noqa: E402
from pagedllm._triton_ops.rotary import rotary_embedding  # noqa: E402

TOLERANCES = {torch.float32: 1e-5, torch.bfloat16: 1.6e-2, torch.float16: 2e-3}


def _cos_sin_cache(rotary_dim: int, positions: int) -> torch.Tensor:
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim))
    freqs = torch.arange(positions).float()[:, None] * inv_freq
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)


@pytest.mark.parametrize("dtype", list(TOLERANCES))
@pytest.mark.parametrize("is_neox_style", [True, False])
@pytest.mark.parametrize(
    "heads, kv_heads, head_size, rotary_dim",
    [(4, 1, 64, 64), (3, 3, 32, 16), (6, 2, 80, 80), (2, 2, 128, 32)],
)
def test_matches_torch_on_slices_of_a_fused_qkv(
    triton_device: torch.device,
    dtype: torch.dtype,
    is_neox_style: bool,
    heads: int,
    kv_heads: int,
    head_size: int,
    rotary_dim: int,
) -> None:
    tokens = 5
    generator = torch.Generator().manual_seed(heads * head_size + rotary_dim)
    q_size, kv_size = heads * head_size, kv_heads * head_size
    qkv = torch.randn(tokens, q_size + 2 * kv_size, generator=generator).to(triton_device, dtype)
    query, key, _ = qkv.split([q_size, kv_size, kv_size], dim=-1)
    positions = torch.tensor([0, 7, 3, 130, 1], device=triton_device)
    cache = _cos_sin_cache(rotary_dim, 256).to(triton_device)
    actual = rotary_embedding(positions, query, key, head_size, cache, is_neox_style)
    expected = _torch_ops.rotary_embedding(positions, query, key, head_size, cache, is_neox_style)
    tolerance = TOLERANCES[dtype]
    for got, want, x in zip(actual, expected, (query, key), strict=True):
        assert got.shape == x.shape and got.dtype == dtype
        torch.testing.assert_close(got, want, atol=tolerance, rtol=tolerance)
        # Lanes past rotary_dim pass through unchanged.
        passed = got.view(tokens, -1, head_size)[..., rotary_dim:]
        assert torch.equal(passed, x.reshape(tokens, -1, head_size)[..., rotary_dim:])


def test_no_tokens(triton_device: torch.device) -> None:
    query = torch.empty(0, 128, device=triton_device)
    key = torch.empty(0, 64, device=triton_device)
    positions = torch.empty(0, dtype=torch.int64, device=triton_device)
    cache = _cos_sin_cache(64, 8).to(triton_device)
    q, k = rotary_embedding(positions, query, key, 64, cache, True)
    assert q.shape == (0, 128) and k.shape == (0, 64)


@pytest.mark.parametrize("dtype", list(TOLERANCES))
@pytest.mark.parametrize("is_neox_style, head_size, rotary_dim", [(True, 64, 64), (False, 80, 32)])
def test_qk_norm_first_matches_the_norms_then_the_rotation(
    triton_device: torch.device,
    dtype: torch.dtype,
    is_neox_style: bool,
    head_size: int,
    rotary_dim: int,
) -> None:
    """Qwen3's q_norm and k_norm folded in: each head RMS-normed with its weight, rounded
    to the dtype, then rotated, as the torch definitions do one after the other."""
    tokens, heads, kv_heads = 4, 4, 2
    generator = torch.Generator().manual_seed(head_size + rotary_dim)
    q_size, kv_size = heads * head_size, kv_heads * head_size
    qkv = torch.randn(tokens, q_size + 2 * kv_size, generator=generator).to(triton_device, dtype)
    query, key, _ = qkv.split([q_size, kv_size, kv_size], dim=-1)
    q_weight, k_weight = (
        (1 + 0.2 * torch.randn(head_size, generator=generator)).to(triton_device, dtype)
        for _ in range(2)
    )
    positions = torch.tensor([3, 0, 200, 17], device=triton_device)
    cache = _cos_sin_cache(rotary_dim, 256).to(triton_device)
    actual = rotary_embedding(
        positions, query, key, head_size, cache, is_neox_style, (q_weight, k_weight, 1e-6)
    )
    normed = [
        _torch_ops.rms_norm(x.reshape(tokens, -1, head_size), w, 1e-6).reshape(tokens, -1)
        for x, w in ((query, q_weight), (key, k_weight))
    ]
    expected = _torch_ops.rotary_embedding(positions, *normed, head_size, cache, is_neox_style)
    # Two roundings to the dtype (the norm's, the rotation's): bf16 results an ulp or two
    # apart where the row's sum, taken in another order, tips the first.
    tolerance = 2 * TOLERANCES[dtype]
    for got, want in zip(actual, expected, strict=True):
        torch.testing.assert_close(got, want, atol=tolerance, rtol=tolerance)
