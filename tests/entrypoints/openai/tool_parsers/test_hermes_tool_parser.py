"""pagedllm/entrypoints/openai/tool_parsers/hermes_tool_parser.py. Reference: the Hermes /
Qwen2.5 / Qwen3 call format (`<tool_call>{"name", "arguments"}</tool_call>` per call) and
vLLM's hermes parser: text outside the blocks is content, a block that is no call stays
content, an unclosed last block is read as far as it goes. Whole and streamed alike."""

import pytest

from pagedllm.entrypoints.openai.tool_parsers import (
    TOOL_PARSERS,
    ExtractedToolCallInformation,
    FunctionCall,
)
from tests.entrypoints.openai.tool_parsers.parser_checks import check_streaming_matches_whole

HERMES = TOOL_PARSERS["hermes"]
WEATHER = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
TIME = '{"name": "get_time", "arguments": {}}'
WEATHER_CALL = FunctionCall("get_weather", '{"city": "Paris"}')
TIME_CALL = FunctionCall("get_time", "{}")


def calls(*found: FunctionCall, content: str | None = None) -> ExtractedToolCallInformation:
    return ExtractedToolCallInformation(bool(found), list(found), content)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"<tool_call>\n{WEATHER}\n</tool_call>", calls(WEATHER_CALL)),
        (
            f"Let me check.\n<tool_call>\n{WEATHER}\n</tool_call>\n"
            f"<tool_call>\n{TIME}\n</tool_call>\n",
            calls(WEATHER_CALL, TIME_CALL, content="Let me check."),
        ),
        (f"\n\n<tool_call>{WEATHER}", calls(WEATHER_CALL)),
        ("No tools needed.\n", calls(content="No tools needed.\n")),
        (
            "<tool_call>not json</tool_call> so there",
            calls(content="<tool_call>not json</tool_call> so there"),
        ),
        (
            f"<tool_call>{WEATHER}</tool_call> and <tool_call>{{",
            calls(WEATHER_CALL, content="and <tool_call>{"),
        ),
        ("a <tool_ca", calls(content="a <tool_ca")),
    ],
)
def test_calls_and_content(text: str, expected: ExtractedToolCallInformation) -> None:
    check_streaming_matches_whole(HERMES, text, expected)


def test_a_call_is_announced_whole_when_its_block_closes() -> None:
    parser = HERMES()
    assert parser.feed("<tool_call>\n" + WEATHER[:20]).tool_calls == []
    (delta,) = parser.feed(WEATHER[20:] + "\n</tool").tool_calls + parser.feed("_call>").tool_calls
    assert (delta.index, delta.name, delta.arguments) == (0, "get_weather", '{"city": "Paris"}')
