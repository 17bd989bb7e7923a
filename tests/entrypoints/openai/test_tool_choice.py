"""pagedllm/entrypoints/openai/tool_choice.py. References: vLLM's tool-choice rules (OpenAI's
defaults, a named function must be one of the tools; "auto" reads answers with the
server's parser) and its forcing schemas, checked with jsonschema: the answers they must
accept and refuse."""

import jsonschema
import pytest

from pagedllm.entrypoints.openai.errors import OpenAIError
from pagedllm.entrypoints.openai.protocol import ChatCompletionRequest
from pagedllm.entrypoints.openai.tool_choice import (
    tool_choice_of,
    tool_choice_schema,
    tool_parser_factory,
)
from pagedllm.entrypoints.openai.tool_parsers import (
    TOOL_PARSERS,
    NamedToolParser,
    RequiredToolParser,
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"$ref": "#/$defs/unit"}},
            "required": ["city"],
            "$defs": {"unit": {"enum": ["C", "F"]}},
        },
    },
}
NOW = {"type": "function", "function": {"name": "now"}}
MESSAGES = [{"role": "user", "content": "hi"}]


def request(**fields: object) -> ChatCompletionRequest:
    return ChatCompletionRequest(messages=MESSAGES, **fields)


def test_openai_defaults_and_the_checks_that_name_the_field() -> None:
    assert tool_choice_of(request()) == "none"
    assert tool_choice_of(request(tools=[WEATHER])) == "auto"
    assert tool_choice_of(request(tools=[WEATHER], tool_choice="none")) == "none"
    with pytest.raises(OpenAIError, match="tool_choice 'required' needs tools") as error:
        tool_choice_of(request(tool_choice="required"))
    assert error.value.param == "tool_choice"
    named = {"type": "function", "function": {"name": "get_wether"}}
    with pytest.raises(OpenAIError, match=r"'get_wether', which is not one of.*'now'"):
        tool_choice_of(request(tools=[WEATHER, NOW], tool_choice=named))


def test_parsers_per_choice_and_auto_takes_the_servers() -> None:
    now = {"type": "function", "function": {"name": "now"}}
    named = tool_choice_of(request(tools=[NOW], tool_choice=now))
    assert isinstance(tool_parser_factory(named, None)(), NamedToolParser)
    assert isinstance(tool_parser_factory("required", None)(), RequiredToolParser)
    assert tool_parser_factory("none", TOOL_PARSERS["hermes"]) is None
    assert tool_parser_factory("auto", TOOL_PARSERS["hermes"]) is TOOL_PARSERS["hermes"]
    tools = request(tools=[WEATHER, NOW]).tools
    generic = tool_parser_factory("auto", TOOL_PARSERS["generic"], tools)()
    assert generic.tools == {"get_weather", "now"}  # it reads calls of these only


def test_named_schema_is_the_functions_parameters() -> None:
    tools = request(tools=[WEATHER, NOW]).tools
    named = {"type": "function", "function": {"name": "get_weather"}}
    schema = tool_choice_schema(tools, request(tools=[WEATHER], tool_choice=named).tool_choice)
    jsonschema.validate({"city": "Paris", "unit": "C"}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"unit": "C"}, schema)
    now = {"type": "function", "function": {"name": "now"}}
    empty = tool_choice_schema(tools, request(tools=[NOW], tool_choice=now).tool_choice)
    assert empty == {"type": "object", "properties": {}}
    assert tool_choice_schema(tools, "auto") is None
    assert tool_choice_schema(tools, "none") is None


def test_required_schema_is_an_array_of_calls_of_any_tool() -> None:
    tools = request(tools=[WEATHER, NOW]).tools
    schema = tool_choice_schema(tools, "required")
    jsonschema.Draft202012Validator.check_schema(schema)
    good = [
        {"name": "get_weather", "parameters": {"city": "Paris", "unit": "F"}},
        {"name": "now", "parameters": {}},
    ]
    jsonschema.validate(good, schema)
    bad = [
        [],
        [{"name": "get_weather", "parameters": {"unit": "C"}}],
        [{"name": "get_weather", "parameters": {"city": "Paris", "unit": "K"}}],
        [{"name": "other", "parameters": {}}],
        [{"name": "now"}],
    ]
    for answer in bad:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(answer, schema)
    assert "$defs" in tools[0].function.parameters  # gathered from a copy
    single = tool_choice_schema(tools, "required", parallel_tool_calls=False)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(good, single)


def test_required_refuses_tools_whose_defs_clash() -> None:
    other = {
        "type": "function",
        "function": {"name": "g", "parameters": {"$defs": {"unit": {"enum": ["K"]}}}},
    }
    tools = request(tools=[WEATHER, other]).tools
    with pytest.raises(OpenAIError, match="tools define \\$defs 'unit' differently"):
        tool_choice_schema(tools, "required")
