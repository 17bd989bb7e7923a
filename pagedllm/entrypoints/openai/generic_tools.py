"""The generic tool-call format, for chat templates that have none (llama.cpp's server has
one too): the tools are described in a system message, with the JSON shape to answer
with, and the answer is constrained to that shape or to plain text, so any model can call
tools and every call parses (tool_parsers/generic_tool_parser.py reads the answers).

The shape: `{"tool_calls": [{"name": "f", "arguments": {...}}, ...]}`, each call's
arguments valid against its tool's parameters; plain text starts with neither `{` nor
whitespace. A request's own constraint (response_format, structured_outputs) wins over
the format's: the tools are still described, the answer is not constrained to them."""

import json
from typing import Any

from pagedllm.entrypoints.openai.errors import OpenAIError
from pagedllm.entrypoints.openai.protocol import ChatCompletionToolsParam
from pagedllm.entrypoints.openai.tool_choice import calls_schema, with_defs
from pagedllm.sampling_params import StructuredOutputsParams
from pagedllm.structured_output import check_grammar, json_or_text_grammar

ANSWER_SHAPE = '{"tool_calls": [{"name": "<tool name>", "arguments": {<arguments>}}]}'


def tools_system_prompt(tools: list[ChatCompletionToolsParam]) -> str:
    """The tools (name, description, parameters' JSON schema), one JSON object a line, and
    how to call them."""
    lines = [
        json.dumps(
            tool.function.model_dump(exclude_none=True, exclude={"strict"}), ensure_ascii=False
        )
        for tool in tools
    ]
    return (
        "You have access to the following tools:\n"
        + "\n".join(lines)
        + "\n\nTo call one or more tools, respond with only a JSON object in this format:\n"
        + ANSWER_SHAPE
        + "\nTo answer without calling a tool, respond in plain text."
    )


def with_tools_system_prompt(conversation: list[dict[str, Any]], prompt: str) -> list[dict]:
    """`conversation` with `prompt` after the first system message's content, or as a
    system message of its own before the others."""
    first = conversation[0] if conversation else {}
    if first.get("role") != "system":
        return [{"role": "system", "content": prompt}, *conversation]
    content = f"{first['content']}\n\n{prompt}" if first.get("content") else prompt
    return [{**first, "content": content}, *conversation[1:]]


def generic_tools_constraint(
    tools: list[ChatCompletionToolsParam], parallel_tool_calls: bool
) -> StructuredOutputsParams:
    """The grammar of the format's answers: plain text or the calls' JSON object (one call
    at most with parallel_tool_calls false); a 400 naming `tools` for a schema llguidance
    cannot compile."""
    calls = calls_schema(tools, "arguments", parallel_tool_calls)
    schema = {
        "type": "object",
        "properties": {"tool_calls": calls},
        "required": ["tool_calls"],
        "additionalProperties": False,
    }
    params = StructuredOutputsParams(grammar=json_or_text_grammar(with_defs(schema, tools)))
    try:
        check_grammar(params, "tools")
    except ValueError as e:
        raise OpenAIError(str(e), param="tools") from e
    return params
