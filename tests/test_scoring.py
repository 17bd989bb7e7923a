"""pagedllm/scoring.py: vLLM's pairing rule (1:1, 1:N, N:N; nothing else) and a pair's
score. Reference: the cosine formula a.b / (|a| |b|) written out, and vLLM's pair tokens
(the first text's ids, the pad token where the tokenizer has one, the second's)."""

import pytest
import torch

from pagedllm.outputs import PoolingOutput, PoolingRequestOutput
from pagedllm.scoring import as_score_inputs, check_score_lengths, cosine_scores

NAMES = ("text_1", "text_2")


def pooled(request_id: str, data: list[float], token_ids: list[int]) -> PoolingRequestOutput:
    return PoolingRequestOutput(request_id, PoolingOutput(torch.tensor(data)), token_ids, True)


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b))
    return dot / (sum(x * x for x in a) ** 0.5 * sum(y * y for y in b) ** 0.5)


@pytest.mark.parametrize(("len_1", "len_2"), [(1, 1), (1, 5), (4, 4)])
def test_one_to_n_and_n_to_n_pair(len_1: int, len_2: int) -> None:
    check_score_lengths(len_1, len_2, NAMES)


@pytest.mark.parametrize(
    ("len_1", "len_2", "message"),
    [
        (2, 3, "text_2 has 3 texts for the 2 of text_1"),
        (3, 1, "text_2 has 1 texts for the 3 of text_1"),
        (0, 2, "text_1 is empty"),
        (1, 0, "text_2 is empty"),
    ],
)
def test_other_lengths_are_refused_naming_the_side(len_1: int, len_2: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_score_lengths(len_1, len_2, NAMES)


def test_a_text_or_a_prompt_alone_is_one_input() -> None:
    assert as_score_inputs("a") == ["a"]
    assert as_score_inputs({"prompt_token_ids": [5]}) == [{"prompt_token_ids": [5]}]
    assert as_score_inputs(("a", "b")) == ["a", "b"]
    with pytest.raises(TypeError, match="a text, a prompt or a list"):
        as_score_inputs(5)


def test_one_against_n_pairs_the_one_with_each() -> None:
    query = pooled("0", [1.0, 2.0, 2.0], [7, 8])
    docs = [pooled("1", [2.0, 0.0, 1.0], [9]), pooled("2", [-1.0, -2.0, -2.0], [10, 11, 12])]
    scores = cosine_scores([query], docs, pad_token_id=0)
    assert [s.request_id for s in scores] == ["0_1", "0_2"]
    assert [s.outputs.score for s in scores] == pytest.approx(
        [cosine([1, 2, 2], [2, 0, 1]), -1.0], abs=1e-6
    )
    assert [s.prompt_token_ids for s in scores] == [[7, 8, 0, 9], [7, 8, 0, 10, 11, 12]]
    assert all(s.finished for s in scores)


def test_n_against_n_pairs_in_order_without_a_pad_token() -> None:
    firsts = [pooled("0", [1.0, 0.0], [3]), pooled("1", [0.0, 3.0], [4])]
    seconds = [pooled("2", [1.0, 1.0], [5]), pooled("3", [0.0, -1.0], [6])]
    scores = cosine_scores(firsts, seconds, pad_token_id=None)
    assert [s.outputs.score for s in scores] == pytest.approx([2**-0.5, -1.0], abs=1e-6)
    assert [s.prompt_token_ids for s in scores] == [[3, 5], [4, 6]]
