"""Scoring pairs of texts (vLLM's score API), as `LLM.score` and the server's /score and
/rerank share it. An embedding model scores as a bi-encoder: each text is embedded on its
own, and a pair's score is the cosine similarity of its two embeddings. A classifier with
one label scores as a cross-encoder: the pair is one prompt (cross_encoder_prompt), and its
score is the label's (after the classifier's score activation).

Pairing (vLLM's): one text against N texts gives N scores (the one text is embedded once
and paired with each); N against N pairs them in order; N against M with N > 1 and N != M
is refused, as is an empty side.
"""

from collections.abc import Sequence
from typing import Any, TypeVar

import torch.nn.functional as F

from pagedllm.classifier_config import ClassifierConfig
from pagedllm.outputs import PoolingRequestOutput, ScoringOutput, ScoringRequestOutput

T = TypeVar("T")


def as_score_inputs(data: T | Sequence[T]) -> list[T]:
    """One side's items: a text (or a prompt dict) alone is one item."""
    if isinstance(data, str | dict):
        return [data]
    if not isinstance(data, Sequence) or isinstance(data, bytes | bytearray):
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


def paired(items_1: list[T], items_2: list[T]) -> list[tuple[T, T]]:
    """The pairs the pairing rule makes (check_score_lengths has checked the lengths): a
    single item on the first side pairs with each of the second's."""
    if len(items_1) == 1:
        items_1 = items_1 * len(items_2)
    return list(zip(items_1, items_2, strict=True))


def cosine_scores(
    outputs_1: list[PoolingRequestOutput],
    outputs_2: list[PoolingRequestOutput],
    pad_token_id: int | None,
) -> list[ScoringRequestOutput]:
    """One ScoringRequestOutput per pair: the cosine similarity of the two pooled vectors
    (float32). A single output on the first side pairs with each of the second's. As
    vLLM's, a pair's `prompt_token_ids` are the first text's ids, the tokenizer's pad token
    (where it has one) and the second's: the tokens a score's usage counts."""
    separator = [] if pad_token_id is None else [pad_token_id]
    return [
        ScoringRequestOutput(
            request_id=f"{a.request_id}_{b.request_id}",
            outputs=ScoringOutput(_cosine(a, b)),
            prompt_token_ids=a.prompt_token_ids + separator + b.prompt_token_ids,
            finished=True,
        )
        for a, b in paired(outputs_1, outputs_2)
    ]


def _cosine(a: PoolingRequestOutput, b: PoolingRequestOutput) -> float:
    vector_a, vector_b = a.outputs.data.float(), b.outputs.data.float()  # [hidden] each
    return F.cosine_similarity(vector_a, vector_b, dim=0).item()


def check_cross_encoder(config: ClassifierConfig) -> None:
    """A pair's score is one number: the classifier must have one label."""
    if config.num_labels != 1:
        raise ValueError(
            f"scoring pairs takes a classifier with one label (a cross-encoder or reranker); "
            f"this model has {config.num_labels} labels: classify the texts instead"
        )


def cross_encoder_prompt(
    tokenizer: Any,
    config: ClassifierConfig,
    text_1: str,
    text_2: str,
    score_template: str | None = None,
    add_special_tokens: bool = True,
    max_length: int | None = None,
) -> tuple[str, list[int]]:
    """A pair's one prompt (vLLM's get_score_prompt) and its token ids: through
    `score_template` where one is given (a chat template over the messages
    [{"role": "query", ...}, {"role": "document", ...}], as Qwen3-Reranker's), else the
    tokenizer's pair encoding (its separator between the texts) for a classifier
    checkpoint, or the texts joined for a generative checkpoint converted to a reranker.
    `max_length` (vLLM's truncate_prompt_tokens on a pair): the tokenizer's truncation to
    that many tokens, its `longest_first` rule on a pair (the longer text loses tokens
    first, so the query stays), its truncation side on one text."""
    kwargs = {"add_special_tokens": add_special_tokens}
    if max_length is not None:
        kwargs |= {"truncation": True, "max_length": max_length}
    if score_template is not None:
        messages = [{"role": "query", "content": text_1}, {"role": "document", "content": text_2}]
        try:
            text = tokenizer.apply_chat_template(
                messages, chat_template=score_template, tokenize=False
            )
        except Exception as e:  # noqa: BLE001 - templates raise anything
            raise ValueError(f"cannot apply the score template: {e}") from e
        return text, _encode(tokenizer, kwargs, text)
    if config.pair_tokenized:
        ids = _encode(tokenizer, kwargs, text_1, text_2)
        return tokenizer.decode(ids), ids
    text = text_1 + text_2
    return text, _encode(tokenizer, kwargs, text)


def _encode(tokenizer: Any, kwargs: dict, text: str, text_pair: str | None = None) -> list[int]:
    """The tokenizer's ids of a text (or a pair); a truncation it cannot make (a length
    shorter than its special tokens) is a ValueError."""
    try:
        return tokenizer(text=text, text_pair=text_pair, **kwargs)["input_ids"]
    except Exception as e:  # noqa: BLE001 - tokenizers raise their own errors
        raise ValueError(f"cannot tokenize the pair: {e}") from e


def cross_encoder_scores(outputs: list[PoolingRequestOutput]) -> list[ScoringRequestOutput]:
    """One ScoringRequestOutput per pair's output: the one label's score."""
    return [
        ScoringRequestOutput(
            request_id=o.request_id,
            outputs=ScoringOutput(o.outputs.data[0].item()),
            prompt_token_ids=o.prompt_token_ids,
            finished=True,
        )
        for o in outputs
    ]
