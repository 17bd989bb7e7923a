"""pagedllm/entrypoints/openai/reasoning/qwen3_reasoning_parser.py. Reference: Qwen3's chat
templates (an answer opens `<think>`; `enable_thinking=False` closes an empty one in the
prompt; the thinking-only templates open it in the prompt) and vLLM's qwen3 parser, whole
and streamed alike."""

import pytest

from pagedllm.entrypoints.openai.reasoning import REASONING_PARSERS
from tests.entrypoints.openai.reasoning.parser_checks import check_streaming_matches_whole

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
