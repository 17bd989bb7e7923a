"""The bodies of OpenAI's Responses API (POST /v1/responses and the stored response's
routes) as pydantic models: the request with its input items, and the response object with
its output items, as the official `openai` client's `Response` model reads them.

Only text is served: input parts are `input_text` / `output_text`, tools are functions.
Other item, part and tool types are a 400 naming the field.
"""

import time
import uuid
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Discriminator, Field, Tag, ValidationInfo, field_validator

from pagedllm.entrypoints.openai.protocol import CacheSalt, OpenAIBaseModel, OpenAIRequestModel


def response_id(prefix: str) -> str:
    """OpenAI's ids of the Responses API: `resp_...`, `msg_...`, `fc_...`, `rs_...`."""
    return f"{prefix}_{uuid.uuid4().hex}"


# Input items.


class TextPart(OpenAIRequestModel):
    """A message's text: `input_text` (user, system) or `output_text` (an earlier answer
    sent back)."""

    type: Literal["input_text", "output_text"]
    text: str


class MessageItem(OpenAIRequestModel):
    """`developer` is the system role of OpenAI's newer models; the chat template sees it
    as `system`, which every template knows."""

    type: Literal["message"] = "message"
    id: str | None = None  # an item sent back keeps its id (input_items lists it)
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[TextPart]

    @property
    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class FunctionCallItem(OpenAIRequestModel):
    type: Literal["function_call"]
    id: str | None = None
    call_id: str
    name: str
    arguments: str  # JSON text


class FunctionCallOutputItem(OpenAIRequestModel):
    type: Literal["function_call_output"]
    id: str | None = None
    call_id: str
    output: str | list[TextPart]

    @property
    def text(self) -> str:
        if isinstance(self.output, str):
            return self.output
        return "".join(part.text for part in self.output)


class ReasoningTextPart(OpenAIRequestModel):
    type: Literal["reasoning_text", "summary_text"]
    text: str


class ReasoningItem(OpenAIRequestModel):
    """An earlier answer's reasoning: its text goes to the next assistant message's
    `reasoning_content`, for templates that render it (others leave it out)."""

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[ReasoningTextPart] = Field(default_factory=list)
    content: list[ReasoningTextPart] | None = None

    @property
    def text(self) -> str:
        return "".join(part.text for part in self.content or self.summary)


def _item_type(item: Any) -> str:
    """Messages may leave out `type` (OpenAI's "easy input message")."""
    kind = item.get("type", "message") if isinstance(item, dict) else getattr(item, "type", None)
    return kind if isinstance(kind, str) else "message"


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")],
    Discriminator(_item_type),
]


# Tools, tool choice, text format.


class FunctionTool(OpenAIRequestModel):
    """`strict` is accepted as in chat: forced calls always follow `parameters`."""

    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamedFunctionChoice(OpenAIRequestModel):
    type: Literal["function"]
    name: str


ToolChoice = Literal["none", "auto", "required"] | NamedFunctionChoice


class TextFormat(OpenAIRequestModel):
    """`text.format`: the chat API's `response_format`, flattened (`name`, `schema` and
    `strict` sit beside `type`)."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, populate_by_name=True)

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class TextConfig(OpenAIRequestModel):
    format: TextFormat = Field(default_factory=lambda: TextFormat(type="text"))


class ReasoningConfig(OpenAIRequestModel):
    """`effort` reaches the chat template as `reasoning_effort`; `summary` is accepted."""

    effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    summary: str | None = None


# The request.

# field -> (whether a value asks for nothing, why the field is refused otherwise)
_REFUSED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "conversation": (lambda v: v is None, "use previous_response_id"),
    "prompt": (lambda v: v is None, "the server stores no prompt templates"),
    "top_logprobs": (lambda v: not v, "logprobs are not implemented for responses"),
    "truncation": (lambda v: v != "auto", "input is never truncated"),
}


class ResponsesRequest(OpenAIRequestModel):
    model: str | None = None
    input: str | list[InputItem]
    instructions: str | None = None
    tools: list[FunctionTool] = Field(default_factory=list)
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None  # None: OpenAI's default, true
    text: TextConfig = Field(default_factory=TextConfig)
    reasoning: ReasoningConfig | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    store: bool = True
    background: bool = False
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    include: list[str] | None = None  # extra output (encrypted reasoning, ...): none is made
    # vLLM's, as on chat: prefix-cache isolation and the request's scheduling priority
    cache_salt: CacheSalt = None
    priority: int = 0
    # Refused unless they ask for nothing (_REFUSED).
    conversation: Any = None
    prompt: Any = None
    top_logprobs: int | None = None
    truncation: Literal["disabled", "auto"] | None = None

    @field_validator("parallel_tool_calls", "stream", "store", "background", mode="before")
    @classmethod
    def _null_means_default(cls, value: object, info: ValidationInfo) -> object:
        """OpenAI's clients may send null for these; it means the default."""
        return cls.model_fields[info.field_name].default if value is None else value

    @field_validator(*_REFUSED)
    @classmethod
    def _implemented(cls, value: object, info: ValidationInfo) -> object:
        """No silent drops: a field that would change the answer, and that the server does
        not implement, is a 400 naming it, unless it asks for nothing."""
        asks_nothing, reason = _REFUSED[info.field_name]
        if not asks_nothing(value):
            raise ValueError(f"{info.field_name} is not supported by pagedllm ({reason})")
        return value


# The response object.


class OutputText(OpenAIBaseModel):
    type: Literal["output_text"] = "output_text"
    text: str = ""
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] = Field(default_factory=list)


ItemStatus = Literal["in_progress", "completed", "incomplete"]


class OutputMessage(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: response_id("msg"))
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    status: ItemStatus = "in_progress"
    content: list[OutputText] = Field(default_factory=list)


class OutputFunctionCall(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: response_id("fc"))
    type: Literal["function_call"] = "function_call"
    call_id: str = Field(default_factory=lambda: response_id("call"))
    name: str
    arguments: str = ""
    status: ItemStatus = "in_progress"


class ReasoningText(OpenAIBaseModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str = ""


class OutputReasoning(OpenAIBaseModel):
    """The reasoning parser's text is the item's `content`; no summary is written."""

    id: str = Field(default_factory=lambda: response_id("rs"))
    type: Literal["reasoning"] = "reasoning"
    summary: list[Any] = Field(default_factory=list)
    content: list[ReasoningText] = Field(default_factory=list)
    status: ItemStatus = "in_progress"


OutputItem = OutputMessage | OutputFunctionCall | OutputReasoning


def item_text(items: list[OutputItem], kind: type[OutputMessage | OutputReasoning]) -> str:
    """The text of `items` of one kind: the answer's (messages) or its reasoning."""
    return "".join(part.text for item in items if isinstance(item, kind) for part in item.content)


class InputTokensDetails(OpenAIBaseModel):
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache


class OutputTokensDetails(OpenAIBaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(OpenAIBaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class IncompleteDetails(OpenAIBaseModel):
    reason: Literal["max_output_tokens"]


ResponseStatus = Literal["queued", "in_progress", "completed", "incomplete", "cancelled", "failed"]


class ResponseError(OpenAIBaseModel):
    """Why a background response failed."""

    code: Literal["server_error"] = "server_error"
    message: str


class ResponseObject(OpenAIBaseModel):
    """What the request asked for is echoed back (`instructions`, `tools`, `text`, ...),
    as OpenAI's API does."""

    id: str = Field(default_factory=lambda: response_id("resp"))
    object: Literal["response"] = "response"
    created_at: int = Field(default_factory=lambda: int(time.time()))
    status: ResponseStatus = "in_progress"
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    model: str
    output: list[OutputItem] = Field(default_factory=list)
    usage: ResponseUsage | None = None
    instructions: str | None = None
    tools: list[FunctionTool] = Field(default_factory=list)
    tool_choice: ToolChoice = "auto"
    parallel_tool_calls: bool = True
    text: TextConfig = Field(default_factory=TextConfig)
    reasoning: ReasoningConfig | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    previous_response_id: str | None = None
    store: bool = True
    background: bool = False
    metadata: dict[str, str] = Field(default_factory=dict)
    user: str | None = None


class DeletedResponse(OpenAIBaseModel):
    id: str
    object: Literal["response"] = "response"
    deleted: Literal[True] = True


class InputItemList(OpenAIBaseModel):
    """GET /v1/responses/{id}/input_items: a page of the response's input items (OpenAI's
    list shape; `after` the last id pages on)."""

    object: Literal["list"] = "list"
    data: list[dict[str, Any]]
    first_id: str | None
    last_id: str | None
    has_more: bool
