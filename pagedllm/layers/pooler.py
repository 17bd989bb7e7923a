"""Pooling (vLLM's Pooler): a prompt's final hidden states (after the model's final norm)
-> one vector (ALL: every token's row), computed chunk by chunk so that chunked prefill pools
the whole prompt.

Each prefill chunk of a pooled prompt gives a partial float32:
    MEAN  the chunk's rows [n, H]              -> kept in a list, one sum / prompt length
    LAST  the chunk's last row [H]             -> the last chunk's is the prompt's last token
    CLS   row 0 of the chunk at position 0 [H] -> the prompt's first token
    ALL   the chunk's rows [n, H]              -> kept in a list, joined into [T, H]
ALL is a token classifier's: each token's row is its own output. MEAN sums the whole
prompt's rows in one reduction at the end, as vLLM keeps a chunked prompt's hidden states
until its last chunk: summing each chunk and adding the sums would
make the vector's last bits depend on where the batch's budget cut the prompt
(docs/determinism.md). A chunk at position 0 starts the accumulation afresh (a preempted
prompt is recomputed from its start).
"""

from collections.abc import Callable

import torch
import torch.nn.functional as F


def pool_chunk(hidden: torch.Tensor, start: int, pooling_type: str) -> torch.Tensor | None:
    """hidden [n, H]: the chunk's rows, its first at prompt position `start` -> the chunk's
    partial in float32, or None where the chunk adds nothing (CLS past the first chunk)."""
    if pooling_type in _EVERY_ROW:
        return hidden.float()
    if pooling_type == "LAST":
        return hidden[-1].float()
    assert pooling_type == "CLS", pooling_type
    return hidden[0].float() if start == 0 else None


_EVERY_ROW = ("MEAN", "ALL")
"""The pooling types that keep every row of every chunk."""

Pooled = torch.Tensor | list[torch.Tensor]
"""A prompt's pooled state: MEAN's and ALL's chunks of rows, in order (joined once, at the
end, not copied again at every chunk), else one row."""


def accumulate(
    pooled: Pooled | None, partial: torch.Tensor, start: int, pooling_type: str
) -> Pooled:
    """The pooled state after a chunk at prompt position `start` gave `partial`."""
    if pooling_type not in _EVERY_ROW:
        return partial
    if pooled is None or start == 0:
        return [partial]
    return [*pooled, partial]


def finish_pooling(
    pooled: Pooled,
    num_tokens: int,
    pooling_type: str,
    normalize: bool,
    dimensions: int | None = None,
    projector: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """The accumulated state of a `num_tokens` prompt -> its vector [dimensions or H] (ALL:
    its rows [num_tokens, H]): MEAN divides by the length; the checkpoint's projection
    (layers/st_projector.py), then Matryoshka truncation, come before the L2 normalisation,
    as sentence-transformers runs its modules."""
    if pooling_type in _EVERY_ROW:
        rows = torch.cat(pooled)
        assert rows.shape[0] == num_tokens, f"{pooling_type} holds every row of the prompt"
        if pooling_type == "ALL":
            return rows
        pooled = rows.sum(dim=0) / num_tokens
    if projector is not None:
        pooled = projector(pooled)
    if dimensions is not None:
        pooled = pooled[:dimensions]
    return F.normalize(pooled, p=2, dim=-1) if normalize else pooled
