"""pagedllm/entrypoints/openai/tool_parsers/mistral_tool_parser.py. Reference: Mistral's
tool-call formats (`[TOOL_CALLS]` then a JSON array of `{"name", "arguments"}`, as Mistral
7B v0.3's template writes them; `[TOOL_CALLS]name[ARGS]{...}` per call, the v11
tokenizer's) and vLLM's mistral parser (text before the token is content, calls streamed:
the name first, then the arguments as generated; calls text that never starts as a call
and does not parse stays content). Whole and streamed alike."""

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

MISTRAL = TOOL_PARSERS["mistral"]
WEATHER = FunctionCall("get_weather", '{"city": "Paris"}')
NOW = FunctionCall("now", "{}")


def calls(*found: FunctionCall, content: str | None = None) -> ExtractedToolCallInformation:
    return ExtractedToolCallInformation(bool(found), list(found), content)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, '
            '{"name": "now", "arguments": {}}]',
            calls(WEATHER, NOW),
        ),
        (
            'Checking. [TOOL_CALLS]{"name": "get_weather", "arguments": {"city": "Paris"}}',
            calls(WEATHER, content="Checking. "),
        ),
        (
            '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]now[ARGS]{}',
            calls(WEATHER, NOW),
        ),
        ("No calls [TOOL", calls(content="No calls [TOOL")),
        ("[TOOL_CALLS] [not json", calls(content="[TOOL_CALLS] [not json")),
        ('[TOOL_CALLS]f{"x": 1}', calls(content='[TOOL_CALLS]f{"x": 1}')),
        ('[TOOL_CALLS][{"arguments": {}, "name": "now"}]', calls(NOW)),  # read whole
        ('[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"} sure', calls(WEATHER)),
    ],
)
def test_calls_and_content(text: str, expected: ExtractedToolCallInformation) -> None:
    check_streaming_matches_whole(MISTRAL, text, expected)


@pytest.mark.parametrize(
    "text",
    [
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, '
        '{"name": "now", "arguments": {"tz": "UTC"}}]',
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]now[ARGS]{"tz": "UTC"}',
    ],
)
def test_calls_stream_name_first_then_arguments(text: str) -> None:
    check_arguments_stream(MISTRAL, text)
