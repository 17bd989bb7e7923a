"""What a chat request's `tools` and `tool_choice` ask for, by vLLM's rules: the checks (a
400 naming the field), the JSON schema that structured outputs follow to force a call
(`"required"`, a named function), and the parser that reads the calls out of the answer.

Without `tool_choice`, a request with tools means "auto" and one without means "none"
(OpenAI's defaults). "none" still shows the tools to the template; "auto" parses the
answer with the server's tool-call parser (the chat template's format, or
`--tool-call-parser`; the generic format also prompts and constrains, generic_tools.py).
"""

import copy
from collections.abc import Callable
from typing import Any

from pagedllm.entrypoints.openai.errors import OpenAIError
from pagedllm.entrypoints.openai.protocol import (
    ChatCompletionNamedToolChoiceParam,
    ChatCompletionRequest,
    ChatCompletionToolsParam,
)
from pagedllm.entrypoints.openai.tool_parsers import (
    GenericToolParser,
    NamedToolParser,
    RequiredToolParser,
    ToolParser,
)
from pagedllm.sampling_params import StructuredOutputsParams
from pagedllm.structured_output import check_grammar

EMPTY_PARAMETERS = {"type": "object", "properties": {}}


def tool_choice_of(request: ChatCompletionRequest) -> str | ChatCompletionNamedToolChoiceParam:
    """The request's tool choice with OpenAI's default filled in; raises a 400 for a
    choice the tools cannot meet."""
    choice = request.tool_choice
    if choice is None:
        return "auto" if request.tools else "none"
    if choice != "none" and not request.tools:
        raise OpenAIError(f"tool_choice {_shown(choice)} needs tools", param="tool_choice")
    if isinstance(choice, ChatCompletionNamedToolChoiceParam):
        names = [tool.function.name for tool in request.tools]
        if choice.function.name not in names:
            raise OpenAIError(
                f"tool_choice names the function {choice.function.name!r}, which is not one "
                f"of the tools: {names}",
                param="tool_choice",
            )
    return choice


def tool_choice_schema(
    tools: list[ChatCompletionToolsParam],
    choice: str | ChatCompletionNamedToolChoiceParam,
    parallel_tool_calls: bool = True,
) -> dict[str, Any] | None:
    """The JSON schema a forced choice's answer follows (vLLM's): a named function's
    parameters; for "required", an array of at least one `{"name", "parameters"}`, any of
    the tools (at most one with parallel_tool_calls false), with the tools' `$defs`
    gathered at the top so their `#/$defs/...` references resolve. None otherwise."""
    if isinstance(choice, ChatCompletionNamedToolChoiceParam):
        tool = next(t for t in tools if t.function.name == choice.function.name)
        return tool.function.parameters or copy.deepcopy(EMPTY_PARAMETERS)
    if choice != "required":
        return None
    return with_defs(calls_schema(tools, "parameters", parallel_tool_calls), tools)


def calls_schema(
    tools: list[ChatCompletionToolsParam], arguments_key: str, parallel_tool_calls: bool
) -> dict[str, Any]:
    """An array of at least one `{"name", arguments_key}` call of any of the tools (at
    most one with parallel_tool_calls false)."""
    calls = [_call_schema(tool, arguments_key) for tool in tools]
    schema = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": calls}}
    if not parallel_tool_calls:
        schema["maxItems"] = 1
    return schema


def with_defs(schema: dict[str, Any], tools: list[ChatCompletionToolsParam]) -> dict[str, Any]:
    """`schema` with the tools' `$defs` gathered at its top, so that the `#/$defs/...`
    references of their parameters resolve."""
    defs = _gathered_defs(tools)
    return {**schema, "$defs": defs} if defs else schema


def _call_schema(tool: ChatCompletionToolsParam, arguments_key: str) -> dict[str, Any]:
    parameters = copy.deepcopy(tool.function.parameters or EMPTY_PARAMETERS)
    parameters.pop("$defs", None)
    return {
        "properties": {
            "name": {"type": "string", "enum": [tool.function.name]},
            arguments_key: parameters,
        },
        "required": ["name", arguments_key],
        "additionalProperties": False,
    }


def _gathered_defs(tools: list[ChatCompletionToolsParam]) -> dict[str, Any]:
    """The union of the tools' `$defs`; a 400 if two tools define one name differently."""
    defs: dict[str, Any] = {}
    for tool in tools:
        own = (tool.function.parameters or {}).get("$defs") or {}
        if not isinstance(own, dict):
            raise OpenAIError(
                f"the $defs of tool {tool.function.name!r} must be an object, got {own!r:.80}",
                param="tools",
            )
        for name, schema in own.items():
            if name in defs and defs[name] != schema:
                raise OpenAIError(
                    f"tools define $defs {name!r} differently; when the answer may call "
                    "any of them, the tools' $defs share one namespace",
                    param="tools",
                )
            defs[name] = schema
    return defs


def check_tools_grammar(params: StructuredOutputsParams) -> StructuredOutputsParams:
    """`params`, the constraint of an answer that calls the tools, once llguidance accepts
    it: a schema it refuses is a 400 naming `tools` (when the request is checked, before
    anything is queued)."""
    try:
        check_grammar(params, "tools")
    except ValueError as e:
        raise OpenAIError(str(e), param="tools") from e
    return params


def tool_parser_factory(
    choice: str | ChatCompletionNamedToolChoiceParam,
    auto_parser: type[ToolParser],
    tools: list[ChatCompletionToolsParam] | None = None,
) -> Callable[[], ToolParser] | None:
    """A new parser for each of the request's answers, or None when the answer is all
    content. `auto_parser` is the server's (the template's format or --tool-call-parser);
    the generic format's reads calls of the request's `tools` only."""
    if isinstance(choice, ChatCompletionNamedToolChoiceParam):
        name = choice.function.name
        return lambda: NamedToolParser(name)
    if choice == "required":
        return RequiredToolParser
    if choice == "auto" and issubclass(auto_parser, GenericToolParser):
        names = [tool.function.name for tool in tools or []]
        return lambda: auto_parser(names)
    if choice == "auto":
        return auto_parser
    return None


def _shown(choice: str | ChatCompletionNamedToolChoiceParam) -> str:
    return repr(choice) if isinstance(choice, str) else repr(choice.model_dump())
