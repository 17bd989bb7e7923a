"""Request and response bodies of Anthropic's Messages API (POST /v1/messages and
/v1/messages/count_tokens), and each request as the chat request it means.

A Messages request maps onto /v1/chat/completions' machinery: `system` becomes a system
message, `tool_use` blocks an assistant's `tool_calls`, each `tool_result` block a `tool`
message, `thinking` blocks `reasoning_content`; `tools` become functions with
`input_schema` as their parameters, and `tool_choice` auto / any / tool / none becomes
"auto" / "required" / a named function / "none"; `output_config.format` (a JSON schema)
becomes `response_format`. Unknown fields are kept in
`model_extra` for the server to log, as Anthropic's clients send newer ones.
"""

import json
import uuid
from http import HTTPStatus
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from pagedllm.entrypoints.openai.protocol import ChatCompletionRequest, OpenAIRequestModel

MESSAGES_PATH = "/v1/messages"


def anthropic_id(prefix: str) -> str:
    """Anthropic's ids: `msg_...`, `toolu_...`."""
    return f"{prefix}_{uuid.uuid4().hex}"


class AnthropicRequestModel(OpenAIRequestModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)


class AnthropicBlock(OpenAIRequestModel):
    """A block of a request (`cache_control`, `citations` and other extras are ignored)."""


# Request content blocks.


class TextBlock(AnthropicBlock):
    type: Literal["text"]
    text: str


class ToolUseBlock(AnthropicBlock):
    """A call of an earlier assistant answer."""

    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]

    def as_chat_call(self) -> dict[str, Any]:
        arguments = json.dumps(self.input, ensure_ascii=False)
        return {"id": self.id, "function": {"name": self.name, "arguments": arguments}}


class ToolResultBlock(AnthropicBlock):
    """A tool's result, in a user message; `is_error` is not shown to the template."""

    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlock] = ""
    is_error: bool | None = None

    def as_chat_message(self) -> dict[str, Any]:
        return {"role": "tool", "tool_call_id": self.tool_use_id, "content": _text(self.content)}


class ThinkingBlock(AnthropicBlock):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(AnthropicBlock):
    """Opaque to this server: left out of the prompt."""

    type: Literal["redacted_thinking"]
    data: str


ContentBlock = Annotated[
    TextBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock,
    Field(discriminator="type"),
]


def _text(content: str | list[TextBlock]) -> str:
    return content if isinstance(content, str) else "".join(b.text for b in content)


class AnthropicMessage(AnthropicBlock):
    role: Literal["user", "assistant"]
    content: str | list[ContentBlock]

    def as_chat_messages(self) -> list[dict[str, Any]]:
        """A user message's tool results come first (each its own `tool` message, right
        after the assistant's calls), then its text."""
        if isinstance(self.content, str):
            return [{"role": self.role, "content": self.content}]
        blocks = self.content
        results = [b.as_chat_message() for b in blocks if isinstance(b, ToolResultBlock)]
        message: dict[str, Any] = {"role": self.role, "content": _text_parts(blocks)}
        calls = [b.as_chat_call() for b in blocks if isinstance(b, ToolUseBlock)]
        if calls:
            message["tool_calls"] = calls
        thinking = "".join(b.thinking for b in blocks if isinstance(b, ThinkingBlock))
        if thinking:
            message["reasoning_content"] = thinking
        has_text = any(isinstance(b, TextBlock) for b in blocks)
        return results + ([message] if has_text or calls or not results else [])


def _text_parts(blocks: list[ContentBlock]) -> list[dict[str, str]]:
    return [{"type": "text", "text": b.text} for b in blocks if isinstance(b, TextBlock)]


# Tools.


class AnthropicTool(AnthropicBlock):
    """A client tool; Anthropic's server tools (web search, ...) have no input_schema and
    are refused by validation."""

    name: str
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None

    def as_chat_tool(self) -> dict[str, Any]:
        function = {"name": self.name, "parameters": self.input_schema}
        if self.description is not None:
            function["description"] = self.description
        return {"type": "function", "function": function}


class ToolChoice(AnthropicBlock):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None

    @model_validator(mode="after")
    def _tool_has_a_name(self) -> "ToolChoice":
        if self.type == "tool" and self.name is None:
            raise ValueError('a tool_choice of type "tool" needs the tool\'s name')
        return self

    def as_chat_tool_choice(self) -> str | dict[str, Any]:
        if self.type == "tool":
            return {"type": "function", "function": {"name": self.name}}
        return {"auto": "auto", "any": "required", "none": "none"}[self.type]


class JsonOutputFormat(AnthropicBlock):
    type: Literal["json_schema"]
    json_schema: dict[str, Any] = Field(alias="schema")


class OutputConfig(AnthropicBlock):
    """`format` constrains the answer with structured outputs; `effort` is ignored."""

    format: JsonOutputFormat | None = None
    effort: str | None = None


# Requests.


class CountTokensRequest(AnthropicRequestModel):
    """POST /v1/messages/count_tokens: the prompt part of a Messages request."""

    model: str
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: ToolChoice | None = None

    def chat_fields(self) -> dict[str, Any]:
        """The chat request's fields for the prompt: messages, tools, tool choice. A last
        assistant message is continued (Anthropic's prefill), not answered."""
        system = [] if self.system is None else [{"role": "system", "content": _text(self.system)}]
        messages = system + [m for message in self.messages for m in message.as_chat_messages()]
        fields: dict[str, Any] = {"model": self.model, "messages": messages}
        if self.messages[-1].role == "assistant":
            fields["add_generation_prompt"] = False
            fields["continue_final_message"] = True
        if self.tools is not None:
            fields["tools"] = [tool.as_chat_tool() for tool in self.tools]
        if self.tool_choice is not None:
            fields["tool_choice"] = self.tool_choice.as_chat_tool_choice()
            fields["parallel_tool_calls"] = not self.tool_choice.disable_parallel_tool_use
        return fields

    def as_chat_request(self) -> ChatCompletionRequest:
        """Raises ValueError (pydantic's ValidationError is one) for what the chat request
        refuses."""
        return ChatCompletionRequest.model_validate(self.chat_fields())


class MessagesRequest(CountTokensRequest):
    """POST /v1/messages. `metadata` is accepted and ignored. The chat request has no
    max_tokens (all the room left): the server caps it with `max_tokens`, as Anthropic
    stops at the context window rather than refusing a large max_tokens."""

    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    metadata: dict[str, Any] | None = None
    output_config: OutputConfig | None = None
    stream: bool = False

    def chat_fields(self) -> dict[str, Any]:
        sampling = {
            "stop": self.stop_sequences,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
        }
        given = {name: value for name, value in sampling.items() if value is not None}
        output_format = self.output_config and self.output_config.format
        if output_format:
            schema = {"name": "output", "schema": output_format.json_schema}
            given["response_format"] = {"type": "json_schema", "json_schema": schema}
        return {**super().chat_fields(), **given, "stream": self.stream}


# Responses.


class TextContent(BaseModel):
    type: Literal["text"] = "text"
    text: str


class ToolUseContent(BaseModel):
    type: Literal["tool_use"] = "tool_use"
    id: str = Field(default_factory=lambda: anthropic_id("toolu"))
    name: str
    input: dict[str, Any]


class ThinkingContent(BaseModel):
    type: Literal["thinking"] = "thinking"
    thinking: str
    signature: str = ""  # this server signs nothing


ResponseContent = TextContent | ToolUseContent | ThinkingContent
StopReason = Literal[
    "end_turn", "max_tokens", "stop_sequence", "tool_use", "model_context_window_exceeded"
]


class AnthropicUsage(BaseModel):
    input_tokens: int
    output_tokens: int


class MessagesResponse(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    content: list[ResponseContent]
    model: str
    stop_reason: StopReason | None
    stop_sequence: str | None = None
    usage: AnthropicUsage


class CountTokensResponse(BaseModel):
    input_tokens: int


# Errors.

_ERROR_TYPES = {
    HTTPStatus.BAD_REQUEST: "invalid_request_error",
    HTTPStatus.UNAUTHORIZED: "authentication_error",
    HTTPStatus.FORBIDDEN: "permission_error",
    HTTPStatus.NOT_FOUND: "not_found_error",
    HTTPStatus.REQUEST_ENTITY_TOO_LARGE: "request_too_large",
    HTTPStatus.TOO_MANY_REQUESTS: "rate_limit_error",
    HTTPStatus.SERVICE_UNAVAILABLE: "overloaded_error",
}


class AnthropicErrorInfo(BaseModel):
    type: str
    message: str


class AnthropicErrorResponse(BaseModel):
    type: Literal["error"] = "error"
    error: AnthropicErrorInfo


def is_messages_path(path: str) -> bool:
    return path == MESSAGES_PATH or path.startswith(MESSAGES_PATH + "/")


def anthropic_error_body(message: str, status_code: int) -> AnthropicErrorResponse:
    """Anthropic's error type for the status: other 4xx are invalid_request_error, other
    5xx api_error."""
    default = "api_error" if status_code >= 500 else "invalid_request_error"
    kind = _ERROR_TYPES.get(status_code, default)
    return AnthropicErrorResponse(error=AnthropicErrorInfo(type=kind, message=message))
