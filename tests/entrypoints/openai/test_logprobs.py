"""pagedllm/entrypoints/openai/logprobs.py on hand-built Logprob dicts. Reference: OpenAI's
two logprobs formats: the legacy completions one (tokens, text_offset, token_logprobs,
top_logprobs as text -> logprob) and chat's (content entries with token, logprob, bytes and
top_logprobs), with JSON's lack of -inf met by vLLM's floor of -9999."""

import json
import math

import pytest

from pagedllm.config import ModelConfig
from pagedllm.engine.tokenizer import get_tokenizer
from pagedllm.entrypoints.openai.logprobs import (
    MIN_LOGPROB,
    TextOffsets,
    chat_logprobs,
    completion_logprobs,
)
from pagedllm.entrypoints.openai.token_bytes import token_bytes
from pagedllm.outputs import Logprob

INF = math.inf


class FakeTokenizer:
    """decode([id]) from a table: enough for the functions under test."""

    TEXTS = {1: "Hel", 2: "lo", 3: " wor", 4: "ld", 5: "é"}

    def decode(self, token_ids: list[int]) -> str:
        return "".join(self.TEXTS[t] for t in token_ids)


def test_completion_logprobs_legacy_format_with_offsets_and_clamp() -> None:
    """text_offset is the offsets given (TextOffsets'); a token without logprobs (an
    echoed first prompt token) has None entries; -inf becomes -9999; top_logprobs maps each
    alternative's text, the chosen token's included."""
    tops = [
        None,
        {2: Logprob(-0.5, 1, "lo"), 4: Logprob(-1.5, 2, "ld")},
        {3: Logprob(-INF, 3, None), 1: Logprob(-0.1, 1, "Hel")},
    ]
    result = completion_logprobs(FakeTokenizer(), [1, 2, 3], tops, [10, 13, 15])
    assert result.tokens == ["Hel", "lo", " wor"]
    assert result.text_offset == [10, 13, 15]
    assert result.token_logprobs == [None, -0.5, MIN_LOGPROB]
    assert result.top_logprobs == [None, {"lo": -0.5, "ld": -1.5}, {" wor": -9999.0, "Hel": -0.1}]
    json.dumps(result.model_dump(), allow_nan=False)  # valid JSON: no -Infinity


def test_completion_logprobs_prefers_the_engines_decoded_text() -> None:
    """The engine's decoded_token (what the output text holds) wins over decode([id]), and
    so "".join(tokens) is the completion's text."""
    tops = [{1: Logprob(-0.3, 1, "H")}, {2: Logprob(-0.2, 1, "ello")}]
    result = completion_logprobs(FakeTokenizer(), [1, 2], tops, [0, 1])
    assert result.tokens == ["H", "ello"]
    assert result.text_offset == [0, 1]
    assert result.top_logprobs == [{"H": -0.3}, {"ello": -0.2}]


def test_completion_logprobs_of_no_tokens_is_empty() -> None:
    result = completion_logprobs(FakeTokenizer(), [], [], [])
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


def test_chat_top_logprobs_are_never_more_than_asked_on_ties() -> None:
    """A sampled token tied with the best one carries vLLM's rank (2, last of its ties)
    beside the top-1 entry's rank 1: top_logprobs=1 is still one entry."""
    tied = [{5: Logprob(-0.5, 2, "é"), 1: Logprob(-0.5, 1, "Hel")}]
    for num_top, expected in [(1, ["Hel"]), (2, ["Hel", "é"])]:
        (entry,) = chat_logprobs(FakeTokenizer(), [5], tied, num_top=num_top).content
        assert [t.token for t in entry.top_logprobs] == expected
    swapped = [{5: Logprob(-0.5, 2, "é"), 1: Logprob(-0.5, 2, "Hel")}]
    (entry,) = chat_logprobs(FakeTokenizer(), [5], swapped, num_top=1).content
    assert len(entry.top_logprobs) == 1


# The default model's tokenizer (byte-level BPE), whose tokens split CJK characters and
# emoji into pieces that decode alone to U+FFFD.
TEXT = "中文：我喜欢😀 ok"


@pytest.fixture(scope="module")
def tokenizer():  # noqa: ANN201 - a transformers tokenizer
    return get_tokenizer(ModelConfig.create())


def test_text_offsets_start_each_piece_where_its_character_does(tokenizer) -> None:
    """Reference: the text decoded from the tokens before each one, its incomplete last
    character left out; the offsets never pass the end of the text."""
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    offsets = TextOffsets(tokenizer, [], 0).of(ids)
    expected = [len(tokenizer.decode(ids[:i]).rstrip("\ufffd")) for i in range(len(ids))]
    assert offsets == expected and max(offsets) <= len(TEXT)
    assert len(ids) > len(set(offsets))  # some characters took several tokens
    streamed = TextOffsets(tokenizer, [], 0)
    assert [o for i in range(0, len(ids), 2) for o in streamed.of(ids[i : i + 2])] == offsets


def test_token_bytes_join_to_the_texts_utf8(tokenizer) -> None:
    """OpenAI's `bytes`: a token's own bytes, which joined give the text, where decoding
    a piece of a character alone gives U+FFFD."""
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    pieces = [token_bytes(tokenizer, i, tokenizer.decode([i])) for i in ids]
    assert b"".join(pieces) == TEXT.encode()
    assert any("\ufffd" in tokenizer.decode([i]) for i in ids)
    eos = tokenizer.eos_token_id
    assert token_bytes(tokenizer, eos, tokenizer.decode([eos])) == tokenizer.eos_token.encode()
