"""A Responses API request -> the chat request that answers it, and a response's output
items -> the assistant message that continues its conversation.

/v1/responses runs on the chat machinery (template, tools, tool-call and reasoning parsers,
structured outputs): `input` items become chat messages (`function_call` items an
assistant message's `tool_calls`, `function_call_output` items `tool` messages, a
`reasoning` item the next assistant message's `reasoning_content`), `instructions` the
system message, `text.format` the `response_format`, `max_output_tokens` the
`max_completion_tokens`.
"""

from typing import Any

from pydantic import ValidationError

from pagedllm.entrypoints.openai.errors import OpenAIError
from pagedllm.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    FunctionCallParam,
    ToolCallParam,
)
from pagedllm.entrypoints.openai.responses_protocol import (
    FunctionCallItem,
    FunctionCallOutputItem,
    InputItem,
    MessageItem,
    NamedFunctionChoice,
    OutputFunctionCall,
    OutputItem,
    OutputMessage,
    OutputReasoning,
    ReasoningItem,
    ResponsesRequest,
    TextFormat,
    item_text,
)


def conversation_of(items: str | list[InputItem]) -> list[ChatMessage]:
    """The chat messages of `input` (a string is one user message)."""
    if isinstance(items, str):
        return [ChatMessage(role="user", content=items)]
    messages: list[ChatMessage] = []
    reasoning = None  # a reasoning item's text, waiting for its assistant message
    for item in items:
        if isinstance(item, ReasoningItem):
            reasoning = item.text or None
        elif isinstance(item, MessageItem):
            role = "system" if item.role == "developer" else item.role
            message = ChatMessage(role=role, content=item.text)
            if role == "assistant":
                message.reasoning_content, reasoning = reasoning, None
            messages.append(message)
        elif isinstance(item, FunctionCallItem):
            messages, reasoning = _with_call(messages, item, reasoning), None
        else:
            messages.append(_tool_message(item))
    return messages


def _with_call(
    messages: list[ChatMessage], item: FunctionCallItem, reasoning: str | None
) -> list[ChatMessage]:
    """Calls join the assistant message right before them (an answer's text and its
    calls are one chat message), or start one."""
    call = ToolCallParam(
        id=item.call_id, function=FunctionCallParam(name=item.name, arguments=item.arguments)
    )
    last = messages[-1] if messages else None
    if last is not None and last.role == "assistant" and reasoning is None:
        last.tool_calls = [*(last.tool_calls or []), call]
        return messages
    message = ChatMessage(role="assistant", tool_calls=[call], reasoning_content=reasoning)
    return [*messages, message]


def _tool_message(item: FunctionCallOutputItem) -> ChatMessage:
    return ChatMessage(role="tool", tool_call_id=item.call_id, content=item.text)


def assistant_message(output: list[OutputItem]) -> ChatMessage | None:
    """A response's output as the assistant message that follows its input (None for no
    output), so `previous_response_id` continues the conversation."""
    if not output:
        return None
    text, reasoning = item_text(output, OutputMessage), item_text(output, OutputReasoning)
    calls = [
        ToolCallParam(id=i.call_id, function=FunctionCallParam(name=i.name, arguments=i.arguments))
        for i in output
        if isinstance(i, OutputFunctionCall)
    ]
    return ChatMessage(
        role="assistant",
        content=text or None,
        reasoning_content=reasoning or None,
        tool_calls=calls or None,
    )


def chat_request_of(
    request: ResponsesRequest, messages: list[ChatMessage]
) -> ChatCompletionRequest:
    """The chat request for `messages` (the conversation so far, `input` included) under
    the request's instructions, tools and options; a 400 for an empty conversation."""
    instructions = request.instructions
    system = [] if instructions is None else [{"role": "system", "content": instructions}]
    if not system and not messages:
        raise OpenAIError("input is empty; give at least one message", param="input")
    body: dict[str, Any] = {
        "model": request.model,
        "messages": [*system, *(m.model_dump(exclude_none=True) for m in messages)],
        "tools": [_chat_tool(tool.model_dump(exclude={"type"})) for tool in request.tools] or None,
        "tool_choice": _chat_tool_choice(request.tool_choice),
        "parallel_tool_calls": request.parallel_tool_calls,
        "response_format": _response_format(request.text.format),
        "max_completion_tokens": request.max_output_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "stream": request.stream,
        "stream_options": {"include_usage": True} if request.stream else None,
        "reasoning_effort": request.reasoning and request.reasoning.effort,
        "user": request.user,
        "cache_salt": request.cache_salt,
        "priority": request.priority,
    }
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as e:
        raise OpenAIError(f"the request cannot be answered: {e}") from e


def _chat_tool(function: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": function}


def _chat_tool_choice(choice: str | NamedFunctionChoice | None) -> Any:
    if isinstance(choice, NamedFunctionChoice):
        return {"type": "function", "function": {"name": choice.name}}
    return choice


def _response_format(format: TextFormat) -> dict[str, Any] | None:
    if format.type != "json_schema":
        return {"type": format.type}
    if format.json_schema is None:
        raise OpenAIError(
            'text.format of type "json_schema" needs schema (a JSON schema)', param="text"
        )
    json_schema = {
        "name": format.name or "response",
        "description": format.description,
        "schema": format.json_schema,
        "strict": format.strict,
    }
    return {"type": "json_schema", "json_schema": json_schema}
