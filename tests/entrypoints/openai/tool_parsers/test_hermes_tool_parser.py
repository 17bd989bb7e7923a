"""pagedllm/entrypoints/openai/tool_parsers/hermes_tool_parser.py. Reference: the Hermes /
Qwen2.5 / Qwen3 call format (`<tool_call>{"name", "arguments"}</tool_call>` per call) and
vLLM's hermes parser: text outside the blocks is content, a block that is no call stays
content, an unclosed last block is read as far as it goes; a call's name streams first,
then its arguments as generated. Whole and streamed alike."""

import pytest

from pagedllm.entrypoints.openai.tool_parsers import (
    TOOL_PARSERS,
    ExtractedToolCallInformation,
    FunctionCall,
)
from tests.entrypoints.openai.tool_parsers.parser_checks import (
    check_arguments_stream,
    check_streaming_matches_whole,
)

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
        # Calls streamed: arguments as the model wrote them, text after them dropped, a
        # call cut by the answer's end keeps what it has; JSON text in a string decoded.
        (
            '<tool_call>{"name": "f", "arguments":{"a":[1, "}"]}} junk</tool_call>',
            calls(FunctionCall("f", '{"a":[1, "}"]}')),
        ),
        ('<tool_call>{"name": "f", "arguments": {"a": 1', calls(FunctionCall("f", '{"a": 1'))),
        (
            '<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>',
            calls(FunctionCall("f", '{"a": 1}')),
        ),
        # Other key orders are read whole when the block closes.
        (
            '<tool_call>{"arguments": {"city": "Paris"}, "name": "get_weather"}</tool_call>',
            calls(WEATHER_CALL),
        ),
    ],
)
def test_calls_and_content(text: str, expected: ExtractedToolCallInformation) -> None:
    check_streaming_matches_whole(HERMES, text, expected)


def test_the_name_goes_out_first_then_the_arguments_as_generated() -> None:
    parser = HERMES()
    assert parser.feed('Sure. <tool_call>\n{"name": "get_weathe').tool_calls == []
    (named,) = parser.feed('r", "arguments": {"ci').tool_calls
    assert (named.index, named.name, named.arguments) == (0, "get_weather", '{"ci')
    (piece,) = parser.feed('ty": "Paris"}}\n</tool_call>').tool_calls
    assert (piece.index, piece.name, piece.arguments) == (0, None, 'ty": "Paris"}')
    two_blocks = (
        f"Let me check.\n<tool_call>\n{WEATHER}\n</tool_call>\n<tool_call>{TIME}</tool_call>"
    )
    check_arguments_stream(HERMES, two_blocks)
