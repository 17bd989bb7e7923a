"""pagedllm/entrypoints/openai/tool_parsers/forced_tool_parsers.py. Reference: the answers
that vLLM's forced tool choices constrain (a named function: its arguments' JSON; required:
a JSON array of {"name", "parameters"}); a call's name goes out first, then its arguments
as generated, and streamed pieces accumulate to the whole answer's calls."""

import pytest

from pagedllm.entrypoints.openai.tool_parsers import (
    ExtractedToolCallInformation,
    FunctionCall,
    NamedToolParser,
    RequiredToolParser,
)
from tests.entrypoints.openai.tool_parsers.parser_checks import (
    check_arguments_stream,
    check_streaming_matches_whole,
)

TWO_CALLS = '[{"name": "f", "parameters": {"a": [1, 2]}}, {"name": "g", "parameters": {}}]'


def calls(*found: FunctionCall, content: str | None = None) -> ExtractedToolCallInformation:
    return ExtractedToolCallInformation(bool(found), list(found), content)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (TWO_CALLS, calls(FunctionCall("f", '{"a": [1, 2]}'), FunctionCall("g", "{}"))),
        (' [ {"name":"f","parameters":{"s":"]"}} ]', calls(FunctionCall("f", '{"s":"]"}'))),
        (TWO_CALLS[:-20], calls(FunctionCall("f", '{"a": [1, 2]}'))),
        ("[1, 2]", calls(content="[1, 2]")),
        ('[{"name', calls()),  # cut off before the first call's parameters began
        ('  [ {"name": "f", "param', calls()),
        ("I will not.", calls(content="I will not.")),
    ],
)
def test_required_calls(text: str, expected: ExtractedToolCallInformation) -> None:
    check_streaming_matches_whole(RequiredToolParser, text, expected)


def test_required_streams_each_name_then_its_arguments() -> None:
    parser = RequiredToolParser()
    (named,) = parser.feed(TWO_CALLS[:35]).tool_calls
    assert (named.index, named.name, named.arguments) == (0, "f", '{"a": ')
    check_arguments_stream(RequiredToolParser, TWO_CALLS.replace("{}", '{"b": 2}'))


def test_named_answer_streams_as_the_arguments() -> None:
    parser = NamedToolParser("f")
    first, second = parser.feed('{"a": '), parser.feed("1}")
    assert (first.tool_calls[0].name, first.tool_calls[0].arguments) == ("f", '{"a": ')
    assert (second.tool_calls[0].name, second.tool_calls[0].arguments) == (None, "1}")
    assert parser.finish().tool_calls == []
    check_streaming_matches_whole(
        lambda: NamedToolParser("f"), '{"a": 1}', calls(FunctionCall("f", '{"a": 1}'))
    )
    assert NamedToolParser("f").extract_tool_calls("") == calls(FunctionCall("f", ""))
