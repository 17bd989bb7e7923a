"""A tool parser fed an answer in pieces of every size must give the same content and calls
as one fed it whole, and a call streams as vLLM streams it (its name first, then its
arguments in pieces as they come): what tests/entrypoints/openai/tool_parsers/ check each
parser on."""

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


def check_arguments_stream(make: Callable[[], ToolParser], text: str) -> None:
    """Fed `text` a character at a time: each call's first delta names it before any of
    its arguments are read, its arguments come in several deltas, and they add up to
    exactly the whole answer's."""
    parser = make()
    deltas = [d for char in text for d in parser.feed(char).tool_calls]
    deltas += parser.finish().tool_calls
    whole = make().extract_tool_calls(text).tool_calls
    assert whole, "the answer holds calls"
    for index, call in enumerate(whole):
        first, *rest = [d for d in deltas if d.index == index]
        assert (first.name, first.arguments) == (call.name, "")
        assert all(d.name is None for d in rest)
        assert len(rest) > 1 and "".join(d.arguments for d in rest) == call.arguments
