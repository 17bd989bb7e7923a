"""Logprobs of sampled (or prompt) tokens: their value, their rank and the top-n."""

from typing import NamedTuple

import torch


class LogprobsTensors(NamedTuple):
    """Per row: column 0 is the chosen token, columns 1..n the top-n by value, descending.

    logprob_token_ids:    [N, n + 1] int64
    logprobs:             [N, n + 1] float32 (logprobs or logits, by the Sampler's mode)
    selected_token_ranks: [N] int64, the number of tokens whose value is at least the chosen
                          one's (vLLM's rank: a token tied with others ranks last of them)
    """

    logprob_token_ids: torch.Tensor
    logprobs: torch.Tensor
    selected_token_ranks: torch.Tensor


def compute_logprobs(logits: torch.Tensor) -> torch.Tensor:
    return logits.log_softmax(dim=-1, dtype=torch.float32)


def gather_logprobs(
    logprobs: torch.Tensor, num_logprobs: int, token_ids: torch.Tensor
) -> LogprobsTensors:
    """logprobs [N, V], token_ids [N] -> the chosen token's entry and the top `num_logprobs`
    (-1: the whole vocabulary, sorted)."""
    k = logprobs.shape[-1] if num_logprobs == -1 else num_logprobs
    top_logprobs, top_ids = torch.topk(logprobs, k, dim=-1)
    token_ids = token_ids.long().unsqueeze(-1)
    token_logprobs = logprobs.gather(-1, token_ids)
    ranks = (logprobs >= token_logprobs).sum(dim=-1)
    return LogprobsTensors(
        torch.cat((token_ids, top_ids), dim=1),
        torch.cat((token_logprobs, top_logprobs), dim=1).float(),
        ranks,
    )
