"""Top-k and top-p (nucleus) filtering with per-row k and p, as vLLM's torch path.

Both keep ties with the boundary token and at least one token per row, matching
transformers' TopKLogitsWarper and TopPLogitsWarper applied in that order.
"""

import torch


def apply_top_k_top_p(
    logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None
) -> torch.Tensor:
    """Set filtered logits [B, V] to -inf. k [B] int64 (V = off), p [B] float32 (1 = off);
    None when no row uses it. May modify `logits` in place."""
    if p is None:
        return logits if k is None else apply_top_k_only(logits, k)
    logits_sort, logits_idx = logits.sort(dim=-1, descending=False)
    if k is not None:
        kth = logits_sort.gather(1, (logits_sort.size(1) - k).unsqueeze(1))
        logits_sort.masked_fill_(logits_sort < kth, float("-inf"))
    cumulative = logits_sort.softmax(dim=-1).cumsum(dim=-1)
    top_p_mask = cumulative <= 1 - p.unsqueeze(1)
    top_p_mask[:, -1] = False
    logits_sort.masked_fill_(top_p_mask, float("-inf"))
    return logits.scatter_(dim=-1, index=logits_idx, src=logits_sort)


def apply_top_k_only(logits: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Top-k without a full sort: one topk of the largest k in the batch."""
    no_top_k = k == logits.shape[1]
    k = k.masked_fill(no_top_k, 1)
    kth = logits.topk(int(k.max()), dim=1).values.gather(1, (k - 1).unsqueeze(1))
    kth.masked_fill_(no_top_k.unsqueeze(1), float("-inf"))
    return logits.masked_fill_(logits < kth, float("-inf"))
