"""pagedllm/entrypoints/openai/tool_parsers/llama3_json_tool_parser.py. Reference: Llama
3.1's JSON tool-call format (`{"name", "parameters"}`, `<|python_tag|>` optional, `;`
between calls) and vLLM's llama3_json parser (calls streamed: the name first, then the
arguments as generated; calls text that never starts as a call and is not all calls is
content). Whole and streamed alike."""

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

LLAMA3 = TOOL_PARSERS["llama3_json"]
WEATHER = FunctionCall("get_weather", '{"city": "Paris"}')


def calls(*found: FunctionCall, content: str | None = None) -> ExtractedToolCallInformation:
    return ExtractedToolCallInformation(bool(found), list(found), content)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"name": "get_weather", "parameters": {"city": "Paris"}}', calls(WEATHER)),
        (
            '<|python_tag|>{"name": "get_weather", "arguments": {"city": "Paris"}} ; '
            '{"name": "now", "parameters": {}}',
            calls(WEATHER, FunctionCall("now", "{}")),
        ),
        ("The weather is fine.", calls(content="The weather is fine.")),
        # After streamed calls, text that is no next call is dropped.
        ('{"name": "f", "parameters": {}} and more', calls(FunctionCall("f", "{}"))),
        # Other key orders are read whole at the end: all calls, or all content.
        ('{"parameters": {}, "name": "f"}', calls(FunctionCall("f", "{}"))),
        (
            '{"parameters": {}, "name": "f"} and more',
            calls(content='{"parameters": {}, "name": "f"} and more'),
        ),
        ('{"not": "a call"}', calls(content='{"not": "a call"}')),
        # A call cut by the answer's end keeps the arguments generated.
        (
            '  {"name": "get_weather", "parameters": {"city": "Par',
            calls(FunctionCall("get_weather", '{"city": "Par')),
        ),
        ("<|python", calls(content="<|python")),
    ],
)
def test_calls_or_content(text: str, expected: ExtractedToolCallInformation) -> None:
    check_streaming_matches_whole(LLAMA3, text, expected)


def test_content_streams_at_once_and_calls_as_generated() -> None:
    parser = LLAMA3()
    assert parser.feed("Hello").content == "Hello"
    parser = LLAMA3()
    (named,) = parser.feed('{"name": "get_weather", "parameters": {"city"').tool_calls
    assert (named.name, named.arguments) == ("get_weather", '{"city"')
    assert [c.arguments for c in parser.feed(': "Paris"}}').tool_calls] == [': "Paris"}']
    assert parser.finish().tool_calls == []
    check_arguments_stream(
        LLAMA3,
        '<|python_tag|>{"name": "get_weather", "arguments": {"city": "Paris"}} ; '
        '{"name": "now", "parameters": {"tz": "UTC"}}',
    )
