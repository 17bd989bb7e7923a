"""pagedllm/entrypoints/openai/tool_parsers/generic_tool_parser.py. Reference: the generic
format's shape (`{"tool_calls": [{"name", "arguments"}]}` or plain text, as
generic_tools.py constrains it): calls' arguments are the JSON text as written, text is
content, calls text that names no call is content. Whole and streamed alike, and a call's
name goes out before its arguments, which stream in pieces."""

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

GENERIC = TOOL_PARSERS["generic"]
ARGUMENTS = '{"city": "Pa}ris\\"", "days": [1, {"x": null}]}'
WEATHER = FunctionCall("get_weather", ARGUMENTS)
NOW = FunctionCall("now", "{}")


def calls(*found: FunctionCall, content: str | None = None) -> ExtractedToolCallInformation:
    return ExtractedToolCallInformation(bool(found), list(found), content)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            f'{{"tool_calls": [{{"name": "get_weather", "arguments": {ARGUMENTS}}}]}}',
            calls(WEATHER),
        ),
        (
            f'{{"tool_calls": [{{"name": "get_weather", "arguments": {ARGUMENTS}}}, '
            '{"name": "now", "arguments": {}}]}',
            calls(WEATHER, NOW),
        ),
        (
            '\n{ "tool_calls" : [ { "name" : "now" , "arguments" :  {} } , '
            '{"name": "now", "arguments": 7}]}',
            calls(NOW, FunctionCall("now", "7")),
        ),
        ("It is sunny {really}.", calls(content="It is sunny {really}.")),
        ('{"weather": "sunny"}', calls(content='{"weather": "sunny"}')),
        ('{"tool_calls": [{"name": "now", "arguments": {"a"', calls(FunctionCall("now", '{"a"'))),
    ],
)
def test_calls_and_content(text: str, expected: ExtractedToolCallInformation) -> None:
    check_streaming_matches_whole(GENERIC, text, expected)


def test_the_name_goes_out_first_then_the_arguments_in_pieces() -> None:
    parser = GENERIC()
    assert parser.feed('{"tool_calls": [{"name": "now", "argu').tool_calls == []
    (named,) = parser.feed('ments": {"a": ').tool_calls
    assert (named.index, named.name, named.arguments) == (0, "now", '{"a": ')
    (piece,) = parser.feed('1}}, {"name"').tool_calls
    assert (piece.index, piece.name, piece.arguments) == (0, None, "1}")
    assert parser.finish().tool_calls == []
    check_arguments_stream(
        GENERIC,
        '{"tool_calls": [{"name": "now", "arguments": {"a": 1}}, '
        '{"name": "get_weather", "arguments": {"city": "Paris"}}]}',
    )
