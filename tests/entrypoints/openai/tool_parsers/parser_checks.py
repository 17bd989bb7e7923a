"""A tool parser fed an answer in pieces of every size must give the same content and calls
as one fed it whole: what tests/entrypoints/openai/tool_parsers/ check each parser on."""

from collections.abc import Callable

from pagedllm.entrypoints.openai.tool_parsers import (
    ExtractedToolCallInformation,
    ToolParser,
)
from pagedllm.entrypoints.openai.tool_parsers.abstract_tool_parser import join_tool_call_deltas


def parse_in_pieces(parser: ToolParser, text: str, size: int) -> ExtractedToolCallInformation:
    deltas = [parser.feed(text[i : i + size]) for i in range(0, len(text), size)]
    deltas.append(parser.finish())
    calls = join_tool_call_deltas(call for d in deltas for call in d.tool_calls)
    content = "".join(d.content for d in deltas)
    return ExtractedToolCallInformation(bool(calls), calls, content or None)


def check_streaming_matches_whole(
    make: Callable[[], ToolParser], text: str, expected: ExtractedToolCallInformation
) -> None:
    assert make().extract_tool_calls(text) == expected
    for size in range(1, len(text) + 1):
        assert parse_in_pieces(make(), text, size) == expected, size
