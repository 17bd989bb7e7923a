"""pagedllm/entrypoints/openai/reasoning/deepseek_r1_reasoning_parser.py. Reference: vLLM's
deepseek_r1 parser (R1 always thinks first; the distills' template opens `<think>` in the
prompt; an answer with no `</think>` is all reasoning), whole and streamed alike."""

import pytest

from pagedllm.entrypoints.openai.reasoning import REASONING_PARSERS
from tests.entrypoints.openai.reasoning.parser_checks import (
    TagTokenizer,
    check_streaming_matches_whole,
)

R1 = REASONING_PARSERS["deepseek_r1"]
DISTILL_PROMPT = "<｜User｜>Hi<｜Assistant｜><think>\n"


@pytest.mark.parametrize(
    ("prompt", "text", "expected"),
    [
        ("", "<think>So.</think>\n\nHello", ("So.", "\n\nHello")),
        (DISTILL_PROMPT, "So.\n</think>\n\nHello", ("So.\n", "\n\nHello")),
        ("", "  <think>So.</think>Hello", ("So.", "Hello")),
        ("", "So. Still thinking", ("So. Still thinking", None)),
        ("", "<think>So.</think>", ("So.", None)),
        ("", "So.</think>a </think> b", ("So.", "a </think> b")),
        ("", "<thin", ("<thin", None)),
        ("", "", (None, None)),
    ],
)
def test_reasoning_then_content(prompt: str, text: str, expected: tuple) -> None:
    check_streaming_matches_whole(R1, prompt, text, expected)


@pytest.mark.parametrize("prompt", ["", DISTILL_PROMPT, "<think>x</think>"])
def test_reasoning_tokens_start_every_answer_in_reasoning(prompt: str) -> None:
    """R1 thinks first, whatever the prompt: a constraint waits for `</think>` (token 8)."""
    tokens = R1.reasoning_tokens(prompt, TagTokenizer())
    assert (tokens.end_token_ids, tokens.in_reasoning, tokens.start_token_id) == ([8], True, None)
