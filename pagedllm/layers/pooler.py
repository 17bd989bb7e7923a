"""Pooling (vLLM's Pooler): a prompt's final hidden states (after the model's final norm)
-> one vector, computed chunk by chunk so that chunked prefill pools the whole prompt.

Each prefill chunk of a pooled prompt gives a partial [H] float32:
    MEAN  the sum of the chunk's rows          -> summed over chunks, / prompt length
    LAST  the chunk's last row                 -> the last chunk's is the prompt's last token
    CLS   row 0 of the chunk at position 0     -> the prompt's first token
A chunk at position 0 starts the accumulation afresh (a preempted prompt is recomputed
from its start).
"""

import torch
import torch.nn.functional as F


def pool_chunk(hidden: torch.Tensor, start: int, pooling_type: str) -> torch.Tensor | None:
    """hidden [n, H]: the chunk's rows, its first at prompt position `start` -> [H] float32,
    or None where the chunk adds nothing (CLS past the first chunk)."""
    if pooling_type == "MEAN":
        return hidden.float().sum(dim=0)
    if pooling_type == "LAST":
        return hidden[-1].float()
    assert pooling_type == "CLS", pooling_type
    return hidden[0].float() if start == 0 else None


def accumulate(
    pooled: torch.Tensor | None, partial: torch.Tensor, start: int, pooling_type: str
) -> torch.Tensor:
    """The pooled state after a chunk at prompt position `start` gave `partial`."""
    if pooled is None or start == 0 or pooling_type != "MEAN":
        return partial
    return pooled + partial


def finish_pooling(
    pooled: torch.Tensor,
    num_tokens: int,
    pooling_type: str,
    normalize: bool,
    dimensions: int | None = None,
) -> torch.Tensor:
    """The accumulated state of a `num_tokens` prompt -> its vector [dimensions or H]:
    MEAN divides by the length; Matryoshka truncation comes before the L2 normalisation."""
    if pooling_type == "MEAN":
        pooled = pooled / num_tokens
    if dimensions is not None:
        pooled = pooled[:dimensions]
    return F.normalize(pooled, p=2, dim=-1) if normalize else pooled
