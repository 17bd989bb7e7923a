"""pagedllm/entrypoints/openai/logprobs.py on hand-built Logprob dicts. Reference: OpenAI's
two logprobs formats: the legacy completions one (tokens, text_offset, token_logprobs,
top_logprobs as text -> logprob) and chat's (content entries with token, logprob, bytes and
top_logprobs), with JSON's lack of -inf met by vLLM's floor of -9999."""

import json
import math

from pagedllm.entrypoints.openai.logprobs import (
    MIN_LOGPROB,
    chat_logprobs,
    completion_logprobs,
)
from pagedllm.outputs import Logprob

INF = math.inf


class FakeTokenizer:
    """decode([id]) from a table: enough for the functions under test."""

    TEXTS = {1: "Hel", 2: "lo", 3: " wor", 4: "ld", 5: "é"}

    def decode(self, token_ids: list[int]) -> str:
        return "".join(self.TEXTS[t] for t in token_ids)


def test_completion_logprobs_legacy_format_with_offsets_and_clamp() -> None:
    """text_offset starts at the given offset and grows by each token's length; a token
    without logprobs (an echoed first prompt token) has None entries; -inf becomes -9999;
    top_logprobs maps each alternative's text, the chosen token's included."""
    tops = [
        None,
        {2: Logprob(-0.5, 1, "lo"), 4: Logprob(-1.5, 2, "ld")},
        {3: Logprob(-INF, 3, None), 1: Logprob(-0.1, 1, "Hel")},
    ]
    result = completion_logprobs(FakeTokenizer(), [1, 2, 3], tops, text_offset=10)
    assert result.tokens == ["Hel", "lo", " wor"]
    assert result.text_offset == [10, 13, 15]
    assert result.token_logprobs == [None, -0.5, MIN_LOGPROB]
    assert result.top_logprobs == [None, {"lo": -0.5, "ld": -1.5}, {" wor": -9999.0, "Hel": -0.1}]
    json.dumps(result.model_dump(), allow_nan=False)  # valid JSON: no -Infinity


def test_completion_logprobs_prefers_the_engines_decoded_text() -> None:
    """The engine's decoded_token (what the output text holds) wins over decode([id]), and
    the offsets follow it, so "".join(tokens) is the completion's text."""
    tops = [{1: Logprob(-0.3, 1, "H")}, {2: Logprob(-0.2, 1, "ello")}]
    result = completion_logprobs(FakeTokenizer(), [1, 2], tops, text_offset=0)
    assert result.tokens == ["H", "ello"]
    assert result.text_offset == [0, 1]
    assert result.top_logprobs == [{"H": -0.3}, {"ello": -0.2}]


def test_completion_logprobs_of_no_tokens_is_empty() -> None:
    result = completion_logprobs(FakeTokenizer(), [], [], text_offset=5)
    assert result.model_dump() == {
        "text_offset": [],
        "token_logprobs": [],
        "tokens": [],
        "top_logprobs": [],
    }


def chat_tops() -> list[dict[int, Logprob]]:
    return [
        {5: Logprob(-0.2, 2, "é"), 1: Logprob(-0.1, 1, "Hel"), 3: Logprob(-3.0, 3, " wor")},
        {
            1: Logprob(-INF, 4, "Hel"),  # sampled, though ranked 4th
            4: Logprob(-2.0, 2, "ld"),
            2: Logprob(-0.01, 1, "lo"),
            3: Logprob(-3.0, 3, None),
        },
    ]


def test_chat_logprobs_bytes_and_top_alternatives_by_rank() -> None:
    """Each entry carries its token's UTF-8 bytes; top_logprobs are the num_top best by
    rank, in rank order, whatever the dict order, and leave out a worse chosen token."""
    result = chat_logprobs(FakeTokenizer(), [5, 1], chat_tops(), num_top=2)
    first, second = result.content
    assert (first.token, first.logprob, first.bytes) == ("é", -0.2, [0xC3, 0xA9])
    assert [(t.token, t.logprob) for t in first.top_logprobs] == [("Hel", -0.1), ("é", -0.2)]
    assert [t.bytes for t in first.top_logprobs] == [list(b"Hel"), [0xC3, 0xA9]]
    assert (second.token, second.logprob, second.bytes) == ("Hel", MIN_LOGPROB, list(b"Hel"))
    assert [(t.token, t.logprob) for t in second.top_logprobs] == [("lo", -0.01), ("ld", -2.0)]
    json.dumps(result.model_dump(), allow_nan=False)


def test_chat_logprobs_num_top_bounds_the_alternatives() -> None:
    """num_top 0 gives no alternatives (logprobs=true without top_logprobs); num_top 3
    reaches a token the tokenizer decodes (no decoded_token from the engine)."""
    none = chat_logprobs(FakeTokenizer(), [5, 1], chat_tops(), num_top=0)
    assert [entry.top_logprobs for entry in none.content] == [[], []]
    three = chat_logprobs(FakeTokenizer(), [5, 1], chat_tops(), num_top=3)
    assert [t.token for t in three.content[1].top_logprobs] == ["lo", "ld", " wor"]
