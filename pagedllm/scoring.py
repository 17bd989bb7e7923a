"""Scoring pairs of texts with an embedding model (vLLM's bi-encoder score): each text is
embedded on its own, and a pair's score is the cosine similarity of its two embeddings.
`LLM.score` and the server's /score and /rerank share these rules.

Pairing (vLLM's): one text against N texts gives N scores (the one text is embedded once
and paired with each); N against N pairs them in order; N against M with N > 1 and N != M
is refused, as is an empty side.
"""

from collections.abc import Sequence
from typing import TypeVar

import torch.nn.functional as F

from pagedllm.outputs import PoolingRequestOutput, ScoringOutput, ScoringRequestOutput

T = TypeVar("T")


def as_score_inputs(data: T | Sequence[T]) -> list[T]:
    """One side's items: a text (or a prompt dict) alone is one item."""
    if isinstance(data, str | dict):
        return [data]
    if not isinstance(data, Sequence):
        raise TypeError(f"score inputs must be a text, a prompt or a list of them, got {data!r}")
    return list(data)


def check_score_lengths(len_1: int, len_2: int, names: tuple[str, str]) -> None:
    """vLLM's pairing rule: 1 against N, or N against N. `names`: the two sides' names
    for the message (`data_1`/`data_2`, `text_1`/`text_2`, `query`/`documents`)."""
    for name, length in zip(names, (len_1, len_2)):
        if length == 0:
            raise ValueError(f"{name} is empty; give at least one text")
    if len_1 > 1 and len_1 != len_2:
        raise ValueError(
            f"{names[1]} has {len_2} texts for the {len_1} of {names[0]}: the lengths must "
            f"be 1 and N (one text against each of N) or N and N (pairwise)"
        )


def cosine_scores(
    outputs_1: list[PoolingRequestOutput],
    outputs_2: list[PoolingRequestOutput],
    pad_token_id: int | None,
) -> list[ScoringRequestOutput]:
    """One ScoringRequestOutput per pair: the cosine similarity of the two pooled vectors
    (float32). A single output on the first side pairs with each of the second's. As
    vLLM's, a pair's `prompt_token_ids` are the first text's ids, the tokenizer's pad token
    (where it has one) and the second's: the tokens a score's usage counts."""
    if len(outputs_1) == 1:
        outputs_1 = outputs_1 * len(outputs_2)
    assert len(outputs_1) == len(outputs_2), "check_score_lengths checks the pairing"
    separator = [] if pad_token_id is None else [pad_token_id]
    return [
        ScoringRequestOutput(
            request_id=f"{a.request_id}_{b.request_id}",
            outputs=ScoringOutput(_cosine(a, b)),
            prompt_token_ids=a.prompt_token_ids + separator + b.prompt_token_ids,
            finished=True,
        )
        for a, b in zip(outputs_1, outputs_2)
    ]


def _cosine(a: PoolingRequestOutput, b: PoolingRequestOutput) -> float:
    vector_a, vector_b = a.outputs.data.float(), b.outputs.data.float()  # [hidden] each
    return F.cosine_similarity(vector_a, vector_b, dim=0).item()
