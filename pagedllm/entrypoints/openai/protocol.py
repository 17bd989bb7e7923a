"""Request and response bodies of the OpenAI-compatible API, as pydantic models.

Field names and defaults follow OpenAI's API; the extra sampling fields (top_k, min_p, ...)
follow vLLM's. Types are checked here; value ranges are checked by SamplingParams, so one
place owns each rule and its message.
"""

import dataclasses
import typing
import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, create_model, field_validator

from pagedllm.sampling_params import (
    REQUEST_FIELDS,
    RequestOutputKind,
    SamplingParams,
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


class StreamOptions(OpenAIRequestModel):
    include_usage: bool = False


def _sampling_param_fields() -> dict[str, tuple[object, object]]:
    """SamplingParams' REQUEST_FIELDS as pydantic field definitions: its types and
    defaults, so the request bodies never drift from the engine's parameters."""
    hints = typing.get_type_hints(SamplingParams)
    defaults = {f.name: f.default for f in dataclasses.fields(SamplingParams)}
    return {name: (hints[name], defaults[name]) for name in REQUEST_FIELDS}


_SamplingParamsFields = create_model(
    "_SamplingParamsFields", __base__=OpenAIRequestModel, **_sampling_param_fields()
)


class SamplingFields(_SamplingParamsFields):
    """Fields shared by completions and chat: SamplingParams' request fields (OpenAI's
    and vLLM's extras), plus OpenAI's request plumbing."""

    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None

    @field_validator(
        "n",
        "stream",
        "temperature",
        "top_p",
        "presence_penalty",
        "frequency_penalty",
        mode="before",
    )
    @classmethod
    def _null_means_default(cls, value: object, info: ValidationInfo) -> object:
        """OpenAI's API lets clients send null for these; it means the default."""
        return cls.model_fields[info.field_name].default if value is None else value

    def sampling_params(
        self, max_tokens: int, logprobs: int | None, prompt_logprobs: int | None = None
    ) -> SamplingParams:
        """DELTA outputs (the server accumulates them itself). Raises ValueError/TypeError
        naming the field when a value is out of range."""
        return SamplingParams(
            **{name: getattr(self, name) for name in REQUEST_FIELDS},
            max_tokens=max_tokens,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            output_kind=RequestOutputKind.DELTA,
        )

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


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


class ChatMessage(OpenAIRequestModel):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None

    def as_template_message(self) -> dict[str, str]:
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        message = {"role": self.role, "content": content or ""}
        if self.name is not None:
            message["name"] = self.name
        return message


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0)
    add_generation_prompt: bool = True

    @property
    def requested_max_tokens(self) -> int | None:
        """max_completion_tokens wins over the deprecated max_tokens, as in OpenAI's API."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens


# /v1/models, /tokenize, /detokenize, /version


class TokenizeRequest(OpenAIRequestModel):
    """Give `prompt` (plain text) or `messages` (run through the chat template)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class DetokenizeRequest(OpenAIRequestModel):
    model: str | None = None
    tokens: TokenIds
