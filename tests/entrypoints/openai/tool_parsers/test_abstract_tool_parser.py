"""pagedllm/entrypoints/openai/tool_parsers/abstract_tool_parser.py. Reference: OpenAI's
tool call format (arguments as JSON text) and the delta merging of its streaming clients
(a call's pieces of one index concatenated)."""

from pagedllm.entrypoints.openai.tool_parsers import FunctionCall, ToolCallDelta
from pagedllm.entrypoints.openai.tool_parsers.abstract_tool_parser import (
    as_function_call,
    join_tool_call_deltas,
)


def test_as_function_call_writes_arguments_as_json_text() -> None:
    keys = ("arguments", "parameters")
    value = {"name": "f", "parameters": {"city": "Zürich"}}
    assert as_function_call(value, keys) == FunctionCall("f", '{"city": "Zürich"}')
    assert as_function_call({"name": "f", "arguments": '{"a": 1}'}, keys).arguments == '{"a": 1}'
    assert as_function_call({"name": "f"}, keys) == FunctionCall("f", "{}")
    for not_a_call in ([], {"name": 3}, {"arguments": {}}, "f"):
        assert as_function_call(not_a_call, keys) is None


def test_join_tool_call_deltas_concatenates_each_index() -> None:
    deltas = [
        ToolCallDelta(0, "f", '{"a"'),
        ToolCallDelta(1, "g", "{}"),
        ToolCallDelta(0, None, ": 1}"),
    ]
    assert join_tool_call_deltas(deltas) == [FunctionCall("f", '{"a": 1}'), FunctionCall("g", "{}")]
