"""The token bitmask against its definition (llguidance's layout: token t is bit t % 32 of
word t // 32 of its row), and the sampler applying it before everything else."""

import torch

from pagedllm.sample.ops.token_bitmask import apply_token_bitmask, unpack_token_bitmask
from pagedllm.sample.sampler import Sampler
from tests.sample.sampler_rows import V, row, sample


def bitmask_of(allowed: list[list[int]], words: int) -> torch.Tensor:
    """The definition: set bit t % 32 of word t // 32 for each allowed t."""
    bitmask = torch.zeros(len(allowed), words, dtype=torch.int64)
    for i, tokens in enumerate(allowed):
        for t in tokens:
            bitmask[i, t // 32] |= 1 << (t % 32)
    return (bitmask - (bitmask >= 2**31) * 2**32).to(torch.int32)  # as int32 bit patterns


def test_unpack_matches_the_definition_bit_by_bit() -> None:
    torch.manual_seed(0)
    allowed = [sorted(torch.randperm(70)[:k].tolist()) for k in (0, 1, 35, 70)]
    allowed.append([31, 63])  # the sign bits of the int32 words
    unpacked = unpack_token_bitmask(bitmask_of(allowed, 3), 70)
    assert unpacked.shape == (5, 70) and unpacked.dtype == torch.bool
    for i, tokens in enumerate(allowed):
        assert unpacked[i].nonzero().flatten().tolist() == tokens


def test_logits_wider_than_the_bitmask_forbid_the_extra_tokens() -> None:
    """A model whose vocab is padded past the tokenizer's: the padding is never allowed."""
    unpacked = unpack_token_bitmask(torch.full((1, 2), -1, dtype=torch.int32), 100)
    assert unpacked[0, :64].all() and not unpacked[0, 64:].any()
    assert unpack_token_bitmask(torch.full((1, 2), -1, dtype=torch.int32), 40).shape == (1, 40)


def test_apply_masks_only_the_listed_rows() -> None:
    logits = torch.randn(3, V)
    expected = logits.clone()
    apply_token_bitmask(logits, torch.tensor([1]), bitmask_of([[2, 5]], 1))
    assert torch.equal(logits[[0, 2]], expected[[0, 2]])
    assert logits[1].isfinite().nonzero().flatten().tolist() == [2, 5]
    assert torch.equal(logits[1, [2, 5]], expected[1, [2, 5]])


def test_sampler_applies_the_bitmask_before_logprobs_and_sampling() -> None:
    """vLLM's order: the bitmask comes first, so raw logprobs renormalise over the allowed
    tokens, greedy takes the best allowed token and random rows draw only allowed ones."""
    logits = torch.randn(3, V)
    logits[:, 0] = 10.0  # the unconstrained favourite
    rows = [
        row([1], [], temperature=0, logprobs=2),
        row([1], [], temperature=0, logprobs=2),
        row([1], [], temperature=1.0, seed=3),
    ]
    for r in rows[1:]:
        r.token_bitmask = bitmask_of([[4, 9]], 1)[0]
    out = sample(Sampler(V), logits, rows)
    assert out.sampled_token_ids[0] == 0
    assert out.sampled_token_ids[1] == (4 if logits[1, 4] > logits[1, 9] else 9)
    assert out.sampled_token_ids[2] in (4, 9)
    assert sorted(out.logprobs.logprob_token_ids[1, 1:].tolist()) == [4, 9]
    pair = torch.log_softmax(logits[1, [4, 9]], dim=0).sort(descending=True).values
    assert torch.allclose(out.logprobs.logprobs[1, 1:], pair, atol=1e-5)
