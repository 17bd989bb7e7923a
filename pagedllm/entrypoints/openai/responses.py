"""Response bodies of the OpenAI-compatible API, as pydantic models (field names follow
OpenAI's API; request bodies are in protocol.py)."""

import time
from typing import ClassVar, Literal

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer

from pagedllm.entrypoints.openai.protocol import OpenAIBaseModel, TokenIds, random_id


class ErrorInfo(OpenAIBaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(OpenAIBaseModel):
    error: ErrorInfo


class PromptTokenUsageInfo(OpenAIBaseModel):
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache


class UsageInfo(OpenAIBaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokenUsageInfo | None = None

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> "UsageInfo":
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
            prompt_tokens_details=PromptTokenUsageInfo(cached_tokens=cached_tokens),
        )


class _TokenIdsIfAsked(OpenAIBaseModel):
    """vLLM's `return_token_ids` fields, left out (not null) when the request did not ask
    for them, so an ordinary answer has OpenAI's shape."""

    token_id_fields: ClassVar[tuple[str, ...]] = ("prompt_token_ids", "token_ids")

    @model_serializer(mode="wrap")
    def _leave_out_unasked(self, handler: SerializerFunctionWrapHandler) -> dict:
        fields = self.token_id_fields
        return {k: v for k, v in handler(self).items() if not (k in fields and v is None)}


class CompletionLogProbs(OpenAIBaseModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class CompletionResponseChoice(_TokenIdsIfAsked):
    """`prompt_token_ids` (streamed: in the choice's first chunk) and `token_ids` (the
    generated ones, never the echoed prompt) with `return_token_ids`, as vLLM's."""

    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_token_ids: TokenIds | None = None
    token_ids: TokenIds | None = None


class CompletionResponse(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: random_id("cmpl"))
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionResponseChoice]
    usage: UsageInfo | None = None
    system_fingerprint: str | None = None  # OpenAI's field; vLLM's null too


class CompletionStreamResponse(CompletionResponse):
    """One SSE chunk: the choices' new text; the last chunk may carry usage alone."""


class ChatCompletionLogProb(OpenAIBaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatCompletionLogProbsContent(ChatCompletionLogProb):
    top_logprobs: list[ChatCompletionLogProb] = Field(default_factory=list)


class ChatCompletionLogProbs(OpenAIBaseModel):
    content: list[ChatCompletionLogProbsContent] | None = None


class FunctionCall(OpenAIBaseModel):
    name: str
    arguments: str  # JSON text


class ToolCall(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: random_id("chatcmpl-tool"))
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantMessage(OpenAIBaseModel):
    """`content` is None when the answer is all reasoning or tool calls; `role` is
    "assistant" unless --response-role or the request's last message names another."""

    role: str = "assistant"
    content: str | None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None


class ChatCompletionResponseChoice(_TokenIdsIfAsked):
    index: int
    message: AssistantMessage
    logprobs: ChatCompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: TokenIds | None = None  # with return_token_ids, as vLLM's


class ChatCompletionResponse(_TokenIdsIfAsked):
    id: str = Field(default_factory=lambda: random_id("chatcmpl"))
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionResponseChoice]
    usage: UsageInfo | None = None
    system_fingerprint: str | None = None  # OpenAI's field; vLLM's null too
    prompt_token_ids: TokenIds | None = None  # with return_token_ids, as vLLM's


class _NoneLeftOut(OpenAIBaseModel):
    """Fields that are None are left out, as OpenAI's streams leave them: its clients merge
    a tool call's pieces key by key, and a null `type` would overwrite the first piece's."""

    @model_serializer(mode="wrap")
    def _leave_out_none(self, handler: SerializerFunctionWrapHandler) -> dict:
        return {key: value for key, value in handler(self).items() if value is not None}


class DeltaFunctionCall(_NoneLeftOut):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(_NoneLeftOut):
    """A piece of call `index`: its first carries id, type and name."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall


class DeltaMessage(OpenAIBaseModel):
    role: str | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChatCompletionResponseStreamChoice(_TokenIdsIfAsked):
    index: int
    delta: DeltaMessage
    logprobs: ChatCompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: TokenIds | None = None  # the chunk's new ids, with return_token_ids


class ChatCompletionStreamResponse(_TokenIdsIfAsked):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionResponseStreamChoice]
    usage: UsageInfo | None = None
    system_fingerprint: str | None = None  # OpenAI's field; vLLM's null too
    prompt_token_ids: TokenIds | None = None  # in the first chunk, with return_token_ids


class ModelCard(OpenAIBaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "pagedllm"
    root: str | None = None
    parent: str | None = None
    max_model_len: int | None = None


class ModelList(OpenAIBaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TokenizeResponse(OpenAIBaseModel):
    count: int
    max_model_len: int
    tokens: TokenIds
    token_strs: list[str] | None = None


class DetokenizeResponse(OpenAIBaseModel):
    prompt: str


class VersionResponse(OpenAIBaseModel):
    version: str
