"""pagedllm/entrypoints/openai/tool_parsers/llama3_json_tool_parser.py. Reference: Llama
3.1's JSON tool-call format (`{"name", "parameters"}`, `<|python_tag|>` optional, `;`
between calls) and vLLM's llama3_json parser (an answer that is not all calls is content).
Whole and streamed alike."""

import pytest

from pagedllm.entrypoints.openai.tool_parsers import (
    TOOL_PARSERS,
    ExtractedToolCallInformation,
    FunctionCall,
)
from tests.entrypoints.openai.tool_parsers.parser_checks import check_streaming_matches_whole

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
        (
            '{"name": "f", "parameters": {}} and more',
            calls(content='{"name": "f", "parameters": {}} and more'),
        ),
        ('{"not": "a call"}', calls(content='{"not": "a call"}')),
        (
            '  {"name": "get_weather", "parameters": {"city": "Par',
            calls(content='  {"name": "get_weather", "parameters": {"city": "Par'),
        ),
        ("<|python", calls(content="<|python")),
    ],
)
def test_calls_or_content(text: str, expected: ExtractedToolCallInformation) -> None:
    check_streaming_matches_whole(LLAMA3, text, expected)


def test_content_streams_at_once_and_calls_wait_for_the_end() -> None:
    parser = LLAMA3()
    assert parser.feed("Hello").content == "Hello"
    parser = LLAMA3()
    assert parser.feed('{"name": "get_weather", "parameters": {"city": "Paris"}}').tool_calls == []
    assert [c.name for c in parser.finish().tool_calls] == ["get_weather"]
