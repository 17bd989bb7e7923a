"""pagedllm/entrypoints/openai/reasoning/qwen3_reasoning_parser.py. Reference: Qwen3's chat
templates (an answer opens `<think>`; `enable_thinking=False` closes an empty one in the
prompt; the thinking-only templates open it in the prompt) and vLLM's qwen3 parser, whole
and streamed alike."""

import pytest

from pagedllm.entrypoints.openai.reasoning import REASONING_PARSERS
from tests.entrypoints.openai.reasoning.parser_checks import (
    TagTokenizer,
    check_streaming_matches_whole,
)

QWEN3 = REASONING_PARSERS["qwen3"]
PROMPT = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
NO_THINKING = PROMPT + "<think>\n\n</think>\n\n"
THINKING_ONLY = PROMPT + "<think>\n"


@pytest.mark.parametrize(
    ("prompt", "text", "expected"),
    [
        (PROMPT, "<think>\nSo.\n</think>\n\nHello", ("\nSo.\n", "\n\nHello")),
        (PROMPT, "Hello, no tags", (None, "Hello, no tags")),
        (NO_THINKING, "Hello <think>x</think>", (None, "Hello <think>x</think>")),
        (THINKING_ONLY, "So.</think>Hello", ("So.", "Hello")),
        (PROMPT, "<think>cut short", ("cut short", None)),
        (PROMPT, "<tool_call>", (None, "<tool_call>")),
        (PROMPT, "<th", (None, "<th")),
    ],
)
def test_reasoning_only_when_opened(prompt: str, text: str, expected: tuple) -> None:
    check_streaming_matches_whole(QWEN3, prompt, text, expected)


def test_reasoning_tokens_say_where_the_parser_finds_reasoning() -> None:
    """An answer to a thinking prompt may open `<think>` (its first token), a thinking-only
    prompt starts the answer inside it, and `enable_thinking=False`'s closed part leaves
    none: the constraint applies from the first token."""
    may_open = QWEN3.reasoning_tokens(PROMPT, TagTokenizer())
    assert (may_open.end_token_ids, may_open.in_reasoning, may_open.start_token_id) == (
        [8],
        False,
        7,
    )
    inside = QWEN3.reasoning_tokens(THINKING_ONLY, TagTokenizer())
    assert (inside.end_token_ids, inside.in_reasoning, inside.start_token_id) == ([8], True, None)
    assert QWEN3.reasoning_tokens(NO_THINKING, TagTokenizer()) is None


USER_TAG = "<|im_start|>user\nWhat does the <think> tag do?<|im_end|>\n<|im_start|>assistant\n"
CUT_TURN = (
    "<|im_start|>assistant\n<think>\nran out<|im_end|>\n<|im_start|>user\nAgain<|im_end|>\n"
    "<|im_start|>assistant\n"
)


@pytest.mark.parametrize("prompt", [USER_TAG, CUT_TURN])
def test_a_tag_inside_the_prompt_opens_nothing(prompt: str) -> None:
    """Only the prompt's end (or a continued final message) can start the answer inside a
    think part: a user's `<think>` or an earlier turn cut off in its reasoning cannot."""
    check_streaming_matches_whole(QWEN3, prompt, "Hello", (None, "Hello"))
    tokens = QWEN3.reasoning_tokens(prompt, TagTokenizer())
    assert (tokens.in_reasoning, tokens.start_token_id) == (False, 7)


def test_a_continued_message_that_opened_a_think_part_is_reasoning() -> None:
    prompt = PROMPT + "<think>\nFirst,"
    text = " then.</think>Hi"
    check_streaming_matches_whole(
        lambda p: QWEN3(p, prefill="<think>\nFirst,"), prompt, text, (" then.", "Hi")
    )
    assert QWEN3.reasoning_tokens(prompt, TagTokenizer(), prefill="<think>\nFirst,").in_reasoning
    closed = "<think>x</think>Sure"
    check_streaming_matches_whole(
        lambda p: QWEN3(p, prefill=closed), PROMPT + closed, ", yes", (None, ", yes")
    )
