"""gather_logprobs against its definition: value = log_softmax at the token, rank = the
number of values at least the token's (vLLM's batched_count_greater_than), top-n sorted
descending."""

import torch

from pagedllm.sample.ops.logprobs import compute_logprobs, gather_logprobs


def test_value_rank_and_sorted_top_n() -> None:
    logits = torch.randn(5, 20)
    logprobs = compute_logprobs(logits)
    torch.testing.assert_close(logprobs, torch.log_softmax(logits, dim=-1))
    tokens = torch.tensor([0, 3, 19, 7, 7])
    out = gather_logprobs(logprobs, 4, tokens)
    assert out.logprob_token_ids.shape == (5, 5) and out.logprobs.shape == (5, 5)
    assert torch.equal(out.logprob_token_ids[:, 0], tokens)
    torch.testing.assert_close(out.logprobs[:, 0], logprobs[torch.arange(5), tokens])
    for i in range(5):
        value = logprobs[i, tokens[i]]
        assert out.selected_token_ranks[i] == int((logprobs[i] >= value).sum())
        top = sorted(range(20), key=lambda t, i=i: -logprobs[i, t].item())[:4]
        assert out.logprob_token_ids[i, 1:].tolist() == top
        assert (out.logprobs[i, 1:].diff() <= 0).all()


def test_a_tied_token_ranks_last_of_its_ties() -> None:
    out = gather_logprobs(torch.tensor([[0.0, -1.0, 0.0, -1.0]]), 0, torch.tensor([3]))
    assert out.selected_token_ranks.tolist() == [4]
    assert out.logprob_token_ids.shape == (1, 1)


def test_minus_one_returns_the_whole_vocab_sorted() -> None:
    logprobs = compute_logprobs(torch.randn(2, 9))
    out = gather_logprobs(logprobs, -1, torch.tensor([1, 2]))
    assert out.logprob_token_ids.shape == (2, 10)
    assert sorted(out.logprob_token_ids[0, 1:].tolist()) == list(range(9))
    torch.testing.assert_close(out.logprobs[:, 1:], logprobs.sort(dim=-1, descending=True).values)
