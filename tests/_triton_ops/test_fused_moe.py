"""_triton_ops.fused_moe against the torch reference: FusedMoE's grouped path (one matmul
per active expert on its tokens, tested against transformers in tests/layers), on the
same layer with moe_kernel switched to TRITON."""

import pytest
import torch

pytest.importorskip("triton")

from pagedllm._custom_ops import MoEKernel  # noqa: E402
from pagedllm._triton_ops.fused_moe import fused_experts  # noqa: E402
from pagedllm.layers.fused_moe import FusedMoE  # noqa: E402

TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 3e-2}


def make_layer(
    device: torch.device, dtype: torch.dtype, num_experts: int, top_k: int, hidden: int,
    inter: int, renormalize: bool = True,
) -> FusedMoE:  # fmt: skip
    layer = FusedMoE(num_experts, top_k, hidden, inter, renormalize=renormalize)
    generator = torch.Generator().manual_seed(num_experts * 100 + top_k)
    for param in (layer.w13_weight, layer.w2_weight):
        param.data = (torch.randn(param.shape, generator=generator) / param.shape[2] ** 0.5).to(
            device, dtype
        )
    return layer


def inputs(
    layer: FusedMoE, num_tokens: int, device: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(num_tokens)
    x = torch.randn(num_tokens, layer.hidden_size, generator=generator)
    logits = torch.randn(num_tokens, layer.num_experts, generator=generator)
    return x.to(device, dtype), logits.to(device, dtype)


def both_paths(layer: FusedMoE, x: torch.Tensor, logits: torch.Tensor):
    """(the Triton path's output, the grouped path's)."""
    layer.moe_kernel = MoEKernel.GROUPED
    expected = layer(x, logits)
    layer.moe_kernel = MoEKernel.TRITON
    return layer(x, logits), expected


def assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    tolerance = TOLERANCE[expected.dtype]
    torch.testing.assert_close(actual, expected, atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "num_experts, top_k, hidden, inter, num_tokens, renormalize",
    [
        (4, 1, 32, 32, 1, True),  # one token: three experts without tokens
        (4, 1, 64, 48, 20, False),  # M > E: the 64-row default blocks, partial K and N tiles
        (8, 2, 32, 64, 7, True),
        (8, 2, 48, 32, 13, False),
        (8, 8, 32, 32, 3, True),  # every expert for every token
    ],
)
@torch.no_grad()
def test_layer_matches_grouped_path(
    triton_device: torch.device, dtype: torch.dtype, num_experts: int, top_k: int,
    hidden: int, inter: int, num_tokens: int, renormalize: bool,
) -> None:  # fmt: skip
    layer = make_layer(triton_device, dtype, num_experts, top_k, hidden, inter, renormalize)
    x, logits = inputs(layer, num_tokens, triton_device, dtype)
    assert_close(*both_paths(layer, x, logits))


@torch.no_grad()
def test_all_tokens_on_one_expert(triton_device: torch.device) -> None:
    """Several blocks of one expert (the last padded), every other expert empty."""
    layer = make_layer(triton_device, torch.float32, 8, 1, 32, 32)
    x, logits = inputs(layer, 20, triton_device, torch.float32)
    logits[:, 5] += 100.0
    actual, expected = both_paths(layer, x, logits)
    assert_close(actual, expected)
    assert expected.abs().max() > 0.1


@torch.no_grad()
def test_small_blocks_and_grouped_program_order(triton_device: torch.device) -> None:
    """16-row blocks, two per expert (20 tokens on each of 4), programs swizzled in groups
    of 2 blocks."""
    layer = make_layer(triton_device, torch.float32, 4, 4, 32, 32)
    x, logits = inputs(layer, 20, triton_device, torch.float32)
    topk_weights, topk_ids = layer.select_experts(logits, x.dtype)
    config = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 16, "BLOCK_SIZE_K": 16, "GROUP_SIZE_M": 2}
    w13, w2 = layer.w13_weight, layer.w2_weight
    actual = fused_experts(x, w13, w2, topk_weights, topk_ids, config=config)
    assert_close(actual, layer.apply_experts(x, topk_weights, topk_ids))


@torch.no_grad()
def test_expert_map_runs_only_local_experts(triton_device: torch.device) -> None:
    """Experts 2..5 of 8 held here (vLLM's expert_map); reference: the grouped path on all
    8 with the other experts' weights zeroed, so their terms are zero."""
    layer = make_layer(triton_device, torch.float32, 8, 2, 32, 32)
    x, logits = inputs(layer, 9, triton_device, torch.float32)
    topk_weights, topk_ids = layer.select_experts(logits, x.dtype)
    expert_map = torch.tensor([-1, -1, 0, 1, 2, 3, -1, -1], device=triton_device)
    w13, w2 = layer.w13_weight[2:6].clone(), layer.w2_weight[2:6].clone()
    actual = fused_experts(x, w13, w2, topk_weights, topk_ids, expert_map, 8)
    for param in (layer.w13_weight, layer.w2_weight):
        param.data[:2] = 0
        param.data[6:] = 0
    assert_close(actual, layer.apply_experts(x, topk_weights, topk_ids))


def test_empty_batch(triton_device: torch.device) -> None:
    layer = make_layer(triton_device, torch.float32, 4, 2, 32, 32)
    layer.moe_kernel = MoEKernel.TRITON
    x = torch.zeros(0, 32, device=triton_device)
    assert layer(x, torch.zeros(0, 4, device=triton_device)).shape == (0, 32)
