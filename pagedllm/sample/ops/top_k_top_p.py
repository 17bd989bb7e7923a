"""Top-k and top-p (nucleus) filtering with per-row k and p.

Top-k keeps the tokens whose logit is at least the k-th largest (ties kept), like
transformers' TopKLogitsWarper. Top-p then keeps the largest tokens until their probability
reaches p, like TopPLogitsWarper applied after it, plus every token tied with the last one
kept (transformers' unstable sort keeps an arbitrary subset of such ties). Each row keeps at
least one token.

vLLM's torch path sorts the whole vocabulary, which on a CPU costs ~450 ms for 64 rows of
152k tokens. Here top-p first looks at the 1024 most likely tokens (~25 ms) and sorts only
the rows whose nucleus is larger than that. That choice, and top-k's largest k, are read on
the host, which on an accelerator waits for the device: there (where a sort is cheap) the
sampler sorts every row instead (`apply_top_k_top_p_sorted`), with the same result.
"""

import torch

from pagedllm.sample.ops.row_chunks import row_chunks

_TOP_P_CANDIDATES = 1024


def apply_top_k_top_p(
    logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None
) -> torch.Tensor:
    """Set filtered logits [B, V] to -inf in place. k [B] int64 (V = off), p [B] float32
    (1 = off); None when no row uses it. A few rows at a time (ops/row_chunks.py)."""
    for rows in row_chunks(logits.shape[0]):
        if k is not None:
            apply_top_k_only(logits[rows], k[rows])
        if p is not None:
            apply_top_p_only(logits[rows], p[rows])
    return logits


def apply_top_k_only(logits: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Top-k without a sort: one topk of the largest k in the batch."""
    no_top_k = k == logits.shape[1]
    k = k.masked_fill(no_top_k, 1)
    kth = logits.topk(int(k.max()), dim=1).values.gather(1, (k - 1).unsqueeze(1))
    kth.masked_fill_(no_top_k.unsqueeze(1), float("-inf"))
    return logits.masked_fill_(logits < kth, float("-inf"))


def apply_top_p_only(logits: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    probs = logits.softmax(dim=-1)
    num_candidates = min(_TOP_P_CANDIDATES, probs.shape[1])
    top_probs = probs.topk(num_candidates, dim=1).values
    threshold, covered = _nucleus_threshold(top_probs, p)
    covered |= p >= 1.0
    if not covered.all():
        rows = (~covered).nonzero().squeeze(1)
        sorted_probs = probs[rows].sort(dim=1, descending=True).values
        threshold[rows] = _nucleus_threshold(sorted_probs, p[rows])[0]
    threshold.masked_fill_((p >= 1.0).unsqueeze(1), 0.0)
    return logits.masked_fill_(probs < threshold, float("-inf"))


def apply_top_k_top_p_sorted(
    logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None
) -> torch.Tensor:
    """apply_top_k_top_p by sorting every row: nothing is read on the host."""
    if k is not None:
        sorted_logits = logits.sort(dim=1, descending=True).values
        kth = sorted_logits.gather(1, (k.clamp(1, logits.shape[1]) - 1).unsqueeze(1))
        kth.masked_fill_((k == logits.shape[1]).unsqueeze(1), float("-inf"))
        logits.masked_fill_(logits < kth, float("-inf"))
    if p is not None:
        probs = logits.softmax(dim=-1)
        sorted_probs = probs.sort(dim=1, descending=True).values
        threshold = _nucleus_threshold(sorted_probs, p)[0]
        threshold.masked_fill_((p >= 1.0).unsqueeze(1), 0.0)
        logits.masked_fill_(probs < threshold, float("-inf"))
    return logits


def _nucleus_threshold(
    top_probs: torch.Tensor, p: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """top_probs [B, K] descending -> (the probability of the last token kept [B, 1], whether
    the nucleus ends within these K tokens [B]).

    The token at position j is kept if the tokens before it hold less than p."""
    cumulative = top_probs.cumsum(dim=1)
    num_kept = 1 + (cumulative[:, :-1] < p.unsqueeze(1)).sum(dim=1, keepdim=True)
    return top_probs.gather(1, num_kept - 1), cumulative[:, -1] >= p
