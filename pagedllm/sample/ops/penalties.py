"""Repetition, frequency and presence penalties, vectorised over the batch (as in vLLM)."""

import itertools

import torch


def get_token_bin_counts(
    token_ids: list[list[int]], vocab_size: int, device: torch.device
) -> torch.Tensor:
    """[B, V] float32: how often each token id occurs in each row's list.

    One scatter-add over the flattened lists; out-of-vocab ids (e.g. a prompt's special
    tokens past the sampled vocab) are dropped, like transformers does.
    """
    lengths = torch.tensor([len(ids) for ids in token_ids], device=device)
    flat = torch.tensor(list(itertools.chain.from_iterable(token_ids)), device=device)
    rows = torch.repeat_interleave(torch.arange(len(token_ids), device=device), lengths)
    counts = torch.zeros(len(token_ids), vocab_size + 1, device=device)
    flat = flat.long().clamp(max=vocab_size)
    counts.index_put_((rows, flat), torch.ones_like(flat, dtype=counts.dtype), accumulate=True)
    return counts[:, :vocab_size]


def apply_penalties(
    logits: torch.Tensor,
    prompt_mask: torch.Tensor | None,
    output_counts: torch.Tensor,
    presence_penalties: torch.Tensor,
    frequency_penalties: torch.Tensor,
    repetition_penalties: torch.Tensor,
) -> torch.Tensor:
    """Penalise logits [B, V] in place, per row.

    Repetition (over prompt and output tokens; skipped when `prompt_mask` is None, i.e. no
    row has one): positive logits are divided by the penalty, the others multiplied.
    Frequency: logits -= f * count_in_output. Presence: logits -= p * (count_in_output > 0).
    prompt_mask [B, V] bool, output_counts [B, V] float32, penalties [B].
    """
    output_mask = output_counts > 0
    if prompt_mask is not None:
        seen = prompt_mask | output_mask
        penalty = torch.where(seen, repetition_penalties.unsqueeze(1), 1.0)
        logits.copy_(torch.where(logits > 0, logits / penalty, logits * penalty))
    logits -= frequency_penalties.unsqueeze(1) * output_counts
    logits -= presence_penalties.unsqueeze(1) * output_mask
    return logits
