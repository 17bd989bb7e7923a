"""pagedllm/entrypoints/openai/tool_parsers/generic_tool_parser.py. Reference: the generic
format's shapes (`{"tool_calls": [{"name", "arguments"}]}` or `{"response": "..."}`, as
generic_tools.py constrains it, or plain text) and `json.loads`: calls' arguments are the
JSON text as written, a reply is the string json.loads reads, text is content, an object
of neither shape is content. Whole and streamed alike, and a call's name goes out before
its arguments, which stream in pieces, as a reply's characters do."""

import json

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
REPLY = '{"response": "It is \\"sunny\\" \\u00e9\\ud83d\\ude00 \\\\ \\/\\n\\té!"}'


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
        (REPLY, calls(content=json.loads(REPLY)["response"])),
        (' { "response" : "Hi"}', calls(content="Hi")),
        ('{"response": "cut off \\u00', calls(content="cut off ")),
        ('{"response": 7}', calls(content='{"response": 7}')),
        # Cut off (max_tokens, a stop string) before a call's arguments or the reply began:
        # no call and no content, not the format's JSON as text.
        ('{"tool_', calls()),
        ('{"tool_calls": [{"name": "get_wea', calls()),
        ('{"tool_calls": [{"name": "now", "argu', calls()),
        ('{"resp', calls()),
        ('{"', calls()),
    ],
)
def test_calls_and_content(text: str, expected: ExtractedToolCallInformation) -> None:
    check_streaming_matches_whole(GENERIC, text, expected)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            '{"tool_calls": [{"name": "<tool name>", "arguments": {}}]}',
            calls(content='{"tool_calls": [{"name": "<tool name>", "arguments": {}}]}'),
        ),
        ('{"tool_calls": [{"name": "now", "arguments": {}}]}', calls(NOW)),
        (
            '{"tool_calls": [{"name": "now", "arguments": {}}, {"name": "x", "arguments": 1}]}',
            calls(NOW),
        ),
    ],
)
def test_only_the_requests_tools_are_called(
    text: str, expected: ExtractedToolCallInformation
) -> None:
    """A name that is not one of the tools (the prompt's placeholder, copied by a model
    answering under the request's own constraint) is no call: a first one leaves the object
    content, a later one is dropped with what follows the calls."""
    check_streaming_matches_whole(lambda: GENERIC(["now", "get_weather"]), text, expected)


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


def test_a_reply_streams_as_content_as_it_comes() -> None:
    parser = GENERIC()
    assert parser.feed('{"resp').content == ""
    assert parser.feed('onse": "It is \\').content == "It is "
    assert parser.feed("n").content == "\n"
    assert parser.feed("\\ud83d").content == ""  # half of a surrogate pair
    assert parser.feed('\\ude00 ok"').content == "\U0001f600 ok"
    assert parser.feed("}").content == "" and parser.finish().content == ""
