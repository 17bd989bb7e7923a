"""Request and response bodies of the OpenAI-compatible API, as pydantic models.

Field names and defaults follow OpenAI's API; the extra sampling fields (top_k, min_p, ...)
follow vLLM's. Types are checked here; value ranges are checked by SamplingParams, so one
place owns each rule and its message.
"""

import dataclasses
import typing
import uuid
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)

from pagedllm.engine.chat_messages import template_message
from pagedllm.entrypoints.openai.response_format import ResponseFormat, structured_outputs_of
from pagedllm.sampling_params import (
    REQUEST_FIELDS,
    RequestOutputKind,
    SamplingParams,
    StructuredOutputsParams,
)
from pagedllm.value_checks import check_text

TokenIds = list[int]


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


class OpenAIBaseModel(BaseModel):
    """Unknown fields are ignored, as OpenAI's clients may send newer ones."""

    model_config = ConfigDict(extra="ignore")


class OpenAIRequestModel(OpenAIBaseModel):
    """A request body: numbers must be finite (NaN and +-Infinity, as JSON literals or
    strings, are refused) and text valid Unicode (no lone surrogates), so no bad value
    reaches the engine. Value ranges are SamplingParams' to check."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _valid_unicode(cls, value: object, info: ValidationInfo) -> object:
        _check_strings(info.field_name, value)
        return value


def _check_strings(name: str, value: object) -> None:
    """Raise ValueError naming `name` if any str inside `value` has a lone surrogate."""
    if isinstance(value, str):
        check_text(name, value)
    elif isinstance(value, list | tuple):
        for item in value:
            _check_strings(name, item)
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_strings(name, key)
            _check_strings(name, item)


def _non_empty_salt(value: object) -> object:
    """vLLM's rule and message."""
    if value is not None and (not isinstance(value, str) or not value):
        raise ValueError("Parameter 'cache_salt' must be a non-empty string if provided.")
    return value


CacheSalt = Annotated[str | None, BeforeValidator(_non_empty_salt)]
"""vLLM's cache_salt: mixed into the prefix-cache hash of the prompt's first block, so
only requests with the same salt share cached blocks."""


class StreamOptions(OpenAIRequestModel):
    """`continuous_usage_stats` (vLLM's): with `include_usage`, every chunk carries the
    usage so far. `include_obfuscation` (OpenAI's) is accepted; no obfuscation padding is
    sent. Any other key is refused, not ignored."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    include_usage: bool = False
    continuous_usage_stats: bool = False
    include_obfuscation: bool | None = None


def _sampling_param_fields() -> dict[str, tuple[object, object]]:
    """SamplingParams' REQUEST_FIELDS as pydantic field definitions: its types and
    defaults, so the request bodies never drift from the engine's parameters."""
    hints = typing.get_type_hints(SamplingParams)
    defaults = {f.name: f.default for f in dataclasses.fields(SamplingParams)}
    return {name: (hints[name], defaults[name]) for name in REQUEST_FIELDS}


_SamplingParamsFields = create_model(
    "_SamplingParamsFields", __base__=OpenAIRequestModel, **_sampling_param_fields()
)


_NULLABLE = ("n", "stream", "temperature", "top_p", "presence_penalty", "frequency_penalty")
_NULLABLE += ("top_k", "min_p", "repetition_penalty")
"""The fields OpenAI documents as nullable, and vLLM's sampling extras it reads as such."""


class SamplingFields(_SamplingParamsFields):
    """Fields shared by completions and chat: SamplingParams' request fields (OpenAI's
    and vLLM's extras), plus OpenAI's request plumbing and vLLM's output options.
    Undeclared fields are kept in `model_extra`, for the server to refuse or log
    (unsupported_fields.py)."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsParams | None = None
    return_token_ids: bool | None = None
    """vLLM's: the answer also carries the prompt's and each choice's token ids."""
    return_tokens_as_token_ids: bool | None = None
    """vLLM's: logprobs name tokens as `token_id:<id>`; None: the server's
    --return-tokens-as-token-ids."""
    request_id: str | None = None
    """vLLM's: the base of the request's id when no X-Request-Id header gives one."""
    use_beam_search: bool = False
    """vLLM's: answer with the `n` best beams of a beam search (serving_beam_search.py)."""
    length_penalty: float = 1.0
    """vLLM's: beam search ranks a beam by its cumulative logprob over its length to this
    power."""
    cache_salt: CacheSalt = None
    priority: int = 0
    """vLLM's: lower is served first, under --scheduling-policy priority (else only 0)."""

    @field_validator("structured_outputs", mode="before")
    @classmethod
    def _known_constraint_fields(cls, value: object) -> object:
        """No silent drop: a key StructuredOutputsParams does not have is refused, not
        ignored (pydantic ignores a dataclass's unknown keys)."""
        if isinstance(value, dict):
            known = {f.name for f in dataclasses.fields(StructuredOutputsParams)}
            unknown = sorted(set(value) - known)
            if unknown:
                raise ValueError(f"unknown fields {unknown}; known: {sorted(known)}")
        return value

    @model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data: object) -> object:
        """OpenAI's API lets clients send null for these; it means the default: the field
        is left unset, so the model's sampling default applies to it as to an absent one."""
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if not (v is None and k in _NULLABLE)}
        return data

    def sampling_params(
        self,
        max_tokens: int,
        logprobs: int | None,
        prompt_logprobs: int | None = None,
        defaults: dict[str, object] | None = None,
    ) -> SamplingParams:
        """DELTA outputs (the server accumulates them itself). `defaults`: the model's
        sampling defaults (sampling_defaults.py), for the fields the request left unset.
        Raises ValueError/TypeError naming the field when a value is out of range."""
        values = {name: getattr(self, name) for name in REQUEST_FIELDS}
        for name, value in (defaults or {}).items():
            if name in values and name not in self.model_fields_set:
                values[name] = value
        return SamplingParams(
            **values,
            max_tokens=max_tokens,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            output_kind=RequestOutputKind.DELTA,
            structured_outputs=structured_outputs_of(self.response_format, self.structured_outputs),
        )

    @model_validator(mode="after")
    def _stream_options_need_a_stream(self) -> "SamplingFields":
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options can only be set when stream is true")
        return self

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        """Usage in every chunk (vLLM's `continuous_usage_stats`, with `include_usage`)."""
        return self.include_usage and self.stream_options.continuous_usage_stats


# /v1/completions


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | TokenIds | list[TokenIds]
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool = False


# /v1/chat/completions


class ContentPart(OpenAIRequestModel):
    type: Literal["text"]
    text: str


class FunctionCallParam(OpenAIRequestModel):
    name: str
    arguments: str  # JSON text, as the assistant's answer gave it


class ToolCallParam(OpenAIRequestModel):
    """A call of an earlier assistant answer, sent back in the conversation."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCallParam


class ChatMessage(OpenAIRequestModel):
    """A message of any role: `tool_calls` (assistant), `tool_call_id` (tool) and
    `reasoning_content` (assistant, for templates that render it) pass to the template."""

    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallParam] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None

    def as_template_message(self) -> dict[str, Any]:
        """As chat_messages.template_message gives it to the template (LLM.chat's rule)."""
        return template_message(self.model_dump(exclude_none=True))


class FunctionDefinition(OpenAIRequestModel):
    """`strict` is accepted: forced calls (tool_choice required or named) always follow
    `parameters`; calls parsed from free text ("auto") are not checked against it."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatCompletionToolsParam(OpenAIRequestModel):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class ChatCompletionNamedFunction(OpenAIRequestModel):
    name: str


class ChatCompletionNamedToolChoiceParam(OpenAIRequestModel):
    type: Literal["function"] = "function"
    function: ChatCompletionNamedFunction


ToolChoice = Literal["none", "auto", "required"] | ChatCompletionNamedToolChoiceParam

# apply_chat_template's own arguments, which chat_template_kwargs must not override.
_TEMPLATE_ARGUMENTS = {
    "conversation",
    "tools",
    "documents",
    "chat_template",
    "add_generation_prompt",
    "continue_final_message",
    "tokenize",
    "padding",
    "truncation",
    "max_length",
    "return_tensors",
    "return_dict",
    "return_assistant_tokens_mask",
    "tokenizer_kwargs",
}


class ChatTemplateFields(OpenAIRequestModel):
    """What reaches the chat template besides the messages (vLLM's fields)."""

    tools: list[ChatCompletionToolsParam] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    """OpenAI's field, handed to the chat template as `reasoning_effort` (templates that
    know it, such as gpt-oss's, use it; others ignore it), as vLLM does."""

    @field_validator("chat_template_kwargs")
    @classmethod
    def _no_template_arguments(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        reserved = sorted(_TEMPLATE_ARGUMENTS.intersection(value or ()))
        if reserved:
            raise ValueError(
                f"{reserved} are set by the server or by their own request fields, not "
                "through chat_template_kwargs"
            )
        return value

    def template_kwargs(self) -> dict[str, Any]:
        """apply_chat_template's keyword arguments besides the conversation."""
        tools = self.tools and [tool.model_dump(exclude_none=True) for tool in self.tools]
        effort = self.reasoning_effort
        return {
            **({} if effort is None else {"reasoning_effort": effort}),
            **(self.chat_template_kwargs or {}),
            "tools": tools,
            "add_generation_prompt": self.add_generation_prompt,
            "continue_final_message": self.continue_final_message,
        }


class ChatCompletionRequest(ChatTemplateFields, SamplingFields):  # SamplingFields' config
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0)
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None  # None: OpenAI's default, true
    include_reasoning: bool = True

    @property
    def requested_max_tokens(self) -> int | None:
        """max_completion_tokens wins over the deprecated max_tokens, as in OpenAI's API."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens


# /v1/models, /tokenize, /detokenize, /version


class TokenizeRequest(ChatTemplateFields):
    """Give `prompt` (plain text) or `messages` (run through the chat template as the chat
    endpoint would: with `tools` and `tool_choice`, the generic tool format's system prompt
    is included where that format applies). `add_special_tokens` (vLLM's): the tokenizer's
    special tokens, by default True for a prompt and False for messages (the template
    places them; True adds them on top)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None
    return_token_strs: bool = False
    """vLLM's: also answer each token as the vocabulary spells it (`token_strs`)."""
    tool_choice: ToolChoice | None = None


class DetokenizeRequest(OpenAIRequestModel):
    model: str | None = None
    tokens: TokenIds


# /v1/load_lora_adapter, /v1/unload_lora_adapter (serving_models.py)


class LoadLoRAAdapterRequest(OpenAIRequestModel):
    lora_name: str
    lora_path: str


class UnloadLoRAAdapterRequest(OpenAIRequestModel):
    lora_name: str
