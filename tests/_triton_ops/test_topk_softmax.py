"""_triton_ops.topk_softmax (a MoE layer's routing) against the torch definition."""

import pytest
import torch

pytest.importorskip("triton")

from pagedllm import _torch_ops  # noqa: E402
from pagedllm._triton_ops.topk_softmax import applies, topk_softmax  # noqa: E402


@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize(
    "num_experts, top_k, logits_dtype, dtype",
    [
        (128, 8, torch.bfloat16, torch.bfloat16),
        (60, 6, torch.float32, torch.float32),
        (8, 2, torch.float16, torch.float16),
        (4, 1, torch.float32, torch.bfloat16),
    ],
)
def test_matches_torch(
    triton_device: torch.device,
    renormalize: bool,
    num_experts: int,
    top_k: int,
    logits_dtype: torch.dtype,
    dtype: torch.dtype,
) -> None:
    generator = torch.Generator().manual_seed(num_experts + top_k)
    logits = (3 * torch.randn(7, num_experts, generator=generator)).to(triton_device, logits_dtype)
    weights, ids = topk_softmax(logits, top_k, renormalize, dtype)
    expected_weights, expected_ids = _torch_ops.topk_softmax(logits, top_k, renormalize, dtype)
    assert weights.dtype == dtype and ids.dtype == torch.int64
    # bfloat16 logits tie often among 128 experts, and torch.topk orders ties its own way
    # (on CPU, not the lowest id first): the picks' logits are the same, in order.
    assert torch.equal(logits.gather(1, ids), logits.gather(1, expected_ids))
    if logits_dtype == torch.float32:
        assert torch.equal(ids, expected_ids)
    tolerance = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(weights, expected_weights, atol=tolerance, rtol=tolerance)


def test_strided_logits_ties_and_no_tokens(triton_device: torch.device) -> None:
    wide = torch.tensor([[0.0, 5.0, 1.0, 5.0, 9.0], [2.0, 2.0, 2.0, 2.0, 9.0]])
    logits = wide[:, :4].to(triton_device)  # rows 5 apart
    weights, ids = topk_softmax(logits, 3, True, torch.float32)
    assert ids.tolist() == [[1, 3, 2], [0, 1, 2]]  # of tied experts, the lowest id first
    torch.testing.assert_close(weights.sum(dim=1), torch.ones(2, device=triton_device))
    none = topk_softmax(logits[:0], 2, True, torch.float32)
    assert none[0].shape == none[1].shape == (0, 2)


def test_what_the_kernel_takes() -> None:
    assert applies(8, 128) and applies(6, 60) and applies(1, 1)
    assert not applies(0, 8) and not applies(9, 8) and not applies(8, 8192)
