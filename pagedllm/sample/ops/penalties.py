"""Repetition, frequency and presence penalties, vectorised over the batch.

vLLM builds dense [B, V] count tensors; only the tokens a row has seen change, so here
they travel as sparse (row, token, count) triples and the penalties touch only those
entries. On a CPU with V = 152k, 64 rows and 300 tokens each, counting and applying
take ~4 ms instead of ~180 ms.

Under async scheduling a row's last output token may still be on the device (sampled by
the step in flight, not yet in the host's lists the counts are built from): such rows'
pending tokens are counted on the device, one more occurrence each.
"""

import itertools
from dataclasses import dataclass

import torch

from pagedllm.device_copy import tensor_to_device


@dataclass
class TokenCounts:
    """A sparse [B, V] count matrix: each (row, token) that occurs, once, with its count."""

    rows: torch.Tensor  # [N] int64
    tokens: torch.Tensor  # [N] int64
    counts: torch.Tensor  # [N] float32


def get_token_counts(
    token_ids: list[list[int]], vocab_size: int, device: torch.device
) -> TokenCounts:
    """Count each row's token ids. Ids outside [0, vocab_size) (a prompt's special tokens
    past the sampled vocab) are dropped, like transformers does."""
    lengths = torch.tensor([len(ids) for ids in token_ids])
    flat = torch.tensor(list(itertools.chain.from_iterable(token_ids)), dtype=torch.long)
    rows = torch.repeat_interleave(torch.arange(len(token_ids)), lengths)
    keep = (flat >= 0) & (flat < vocab_size)
    keys, counts = torch.unique(rows[keep] * vocab_size + flat[keep], return_counts=True)
    return TokenCounts(
        tensor_to_device(keys // vocab_size, device),
        tensor_to_device(keys % vocab_size, device),
        tensor_to_device(counts.float(), device),
    )


def apply_penalties(
    logits: torch.Tensor,
    seen_tokens: TokenCounts | None,
    output_tokens: TokenCounts | None,
    presence_penalties: torch.Tensor,
    frequency_penalties: torch.Tensor,
    repetition_penalties: torch.Tensor,
    pending: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Penalise logits [B, V] in place; penalties [B].

    Repetition, over `seen_tokens` (prompt and output): positive logits are divided by the
    penalty, the others multiplied. Frequency and presence, over `output_tokens`:
    logits -= f * count_in_output + p * (count_in_output > 0). None skips that part.
    `pending` (rows [P], tokens [P], distinct rows): one more output token of those rows,
    not in the counts; all on the device, nothing read on the host.
    """
    if seen_tokens is not None:
        rows, tokens = seen_tokens.rows, seen_tokens.tokens
        _repeat(logits, rows, tokens, repetition_penalties[rows])
        if pending is not None:  # a token seen before is penalised once, already
            rows, tokens = pending
            seen = _counted(pending, seen_tokens, logits.shape[1])
            _repeat(logits, rows, tokens, torch.where(seen, 1.0, repetition_penalties[rows]))
    if output_tokens is not None:
        rows, tokens = output_tokens.rows, output_tokens.tokens
        shift = frequency_penalties[rows] * output_tokens.counts + presence_penalties[rows]
        logits[rows, tokens] -= shift
        if pending is not None:  # one more occurrence; present if it was not yet
            rows, tokens = pending
            new = ~_counted(pending, output_tokens, logits.shape[1])
            logits[rows, tokens] -= frequency_penalties[rows] + presence_penalties[rows] * new
    return logits


def _repeat(
    logits: torch.Tensor, rows: torch.Tensor, tokens: torch.Tensor, penalty: torch.Tensor
) -> None:
    """The repetition penalty at (rows, tokens), in place: positive logits divided by it,
    the others multiplied."""
    values = logits[rows, tokens]
    logits[rows, tokens] = torch.where(values > 0, values / penalty, values * penalty)


def _counted(
    pending: tuple[torch.Tensor, torch.Tensor], counts: TokenCounts, vocab_size: int
) -> torch.Tensor:
    """[P] bool: whether each pending (row, token) is among the counts' entries. Both sides'
    keys are distinct (pending rows are; counts hold each entry once), and saying so keeps
    torch.isin from its torch.unique, which on a GPU waits for the device to read a size."""
    rows, tokens = pending
    keys = counts.rows * vocab_size + counts.tokens
    return torch.isin(rows * vocab_size + tokens, keys, assume_unique=True)
