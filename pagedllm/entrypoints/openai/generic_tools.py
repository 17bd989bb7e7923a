"""The generic tool-call format, for chat templates that have none (llama.cpp's server has
one too): the tools are described in a system message, with the JSON shapes to answer
with, and every answer is one JSON object, a call or a reply, so any model can call tools
and every call parses (tool_parsers/generic_tool_parser.py reads the answers).

The shapes: `{"tool_calls": [{"name": "f", "arguments": {...}}]}`, each call's arguments
valid against its tool's parameters, or `{"response": "..."}`. The model chooses between
the two keys right after `{"`, with the user's request in view: a small model asked to
choose between text and JSON at its first token answers in text nearly always. One call
per answer unless the request sets parallel_tool_calls true (llama.cpp's default): a small
model allowed more repeats its call until max_tokens. A tool already called since the
user's last message is not offered again: a small model shown a call and its result calls
the same tool again instead of answering, and an agent framework's loop never ends (a
client that wants the tool again names it in tool_choice). A request's own constraint
(response_format, structured_outputs) wins over the format's: the tools are still
described, the answer is not constrained to them."""

import json
from typing import Any

from pagedllm.entrypoints.openai.protocol import ChatCompletionToolsParam, ChatMessage
from pagedllm.entrypoints.openai.tool_choice import calls_schema, check_tools_grammar, with_defs
from pagedllm.sampling_params import StructuredOutputsParams

ANSWER_SHAPE = '{"tool_calls": [{"name": "<tool name>", "arguments": {<arguments>}}]}'
REPLY_SHAPE = '{"response": "<your reply>"}'
_REPLY_SCHEMA = {
    "type": "object",
    "properties": {"response": {"type": "string"}},
    "required": ["response"],
    "additionalProperties": False,
}


def tools_system_prompt(tools: list[ChatCompletionToolsParam]) -> str:
    """How to answer, then the tools (name, description, parameters' JSON schema), one
    JSON object a line. The order and wording are what the default model (SmolLM2-135M)
    follows best: calls when asked for what a tool does, replies to greetings
    (docs/tool-calling.md has the measurements)."""
    lines = [
        json.dumps(
            tool.function.model_dump(exclude_none=True, exclude={"strict"}), ensure_ascii=False
        )
        for tool in tools
    ]
    return (
        "Always respond with one JSON object. When the user asks for something one of the "
        f"tools below does, call it:\n{ANSWER_SHAPE}\n"
        f"Otherwise, reply to the user:\n{REPLY_SHAPE}\n"
        "Do not call a tool when the user just greets you or chats.\n\n"
        "The tools:\n" + "\n".join(lines)
    )


def generic_conversations(conversation: list[dict[str, Any]], prompt: str) -> list[list[dict]]:
    """`conversation` as the generic format shows it to a template that knows no tool
    calls: `prompt` in the system message, and each assistant message's calls written
    into its content in the format's shape (a template shows only the content). Where the
    conversation has no system message, a second form for templates that refuse one
    (Gemma's, Mistral's first): `prompt` before the first user message's text, as llama.cpp
    folds a system message into such templates."""
    shown = [_with_calls_shown(m) for m in conversation]
    forms = [with_tools_system_prompt(shown, prompt)]
    if not (shown and shown[0].get("role") == "system"):
        forms.append(with_tools_user_prompt(shown, prompt))
    return forms


def with_tools_system_prompt(conversation: list[dict[str, Any]], prompt: str) -> list[dict]:
    """`conversation` with `prompt` after the first system message's content, or as a
    system message of its own before the others."""
    first = conversation[0] if conversation else {}
    if first.get("role") != "system":
        return [{"role": "system", "content": prompt}, *conversation]
    content = f"{first['content']}\n\n{prompt}" if first.get("content") else prompt
    return [{**first, "content": content}, *conversation[1:]]


def with_tools_user_prompt(conversation: list[dict[str, Any]], prompt: str) -> list[dict]:
    """`conversation` with `prompt` before the first user message's content (or as a user
    message of its own first, if there is none)."""
    for i, message in enumerate(conversation):
        if message.get("role") == "user":
            content = f"{prompt}\n\n{message['content']}" if message.get("content") else prompt
            return [*conversation[:i], {**message, "content": content}, *conversation[i + 1 :]]
    return [{"role": "user", "content": prompt}, *conversation]


def _with_calls_shown(message: dict[str, Any]) -> dict[str, Any]:
    if not message.get("tool_calls"):
        return message
    calls = [
        {"name": call["function"]["name"], "arguments": call["function"]["arguments"]}
        for call in message["tool_calls"]
    ]
    shown = json.dumps({"tool_calls": calls}, ensure_ascii=False)
    content = f"{message['content']}\n\n{shown}" if message.get("content") else shown
    return {**message, "content": content}


def called_since_user(messages: list[ChatMessage]) -> set[str]:
    """The names of the tools the assistant called after the last user message."""
    called = set()
    for message in reversed(messages):
        if message.role == "user":
            break
        called.update(call.function.name for call in message.tool_calls or [])
    return called


def generic_tools_constraint(
    tools: list[ChatCompletionToolsParam],
    parallel_tool_calls: bool,
    called: set[str] | frozenset[str] = frozenset(),
) -> StructuredOutputsParams:
    """The JSON schema of the format's answers: a call of a tool not in `called` (one call
    at most unless parallel_tool_calls), or the reply (the only answer once every tool is
    called); a 400 naming `tools` for a schema llguidance cannot compile."""
    offered = [tool for tool in tools if tool.function.name not in called]
    answers = [_REPLY_SCHEMA]
    if offered:
        calls = calls_schema(offered, "arguments", parallel_tool_calls)
        schema = {
            "type": "object",
            "properties": {"tool_calls": calls},
            "required": ["tool_calls"],
            "additionalProperties": False,
        }
        answers.insert(0, schema)
    answer_schema = with_defs({"anyOf": answers}, offered)
    return check_tools_grammar(StructuredOutputsParams(json=answer_schema))
