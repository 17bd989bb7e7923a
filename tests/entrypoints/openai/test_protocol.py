"""pagedllm/entrypoints/openai/protocol.py, the request bodies. References: SamplingParams
(its REQUEST_FIELDS, their defaults, and the object it builds from the same values),
OpenAI's API (null means the default; unknown fields are kept aside; max_completion_tokens wins
over max_tokens; content parts), and JSON/Unicode validity (no NaN, Infinity or lone
surrogates reach the engine)."""

import dataclasses

import pytest
from pydantic import ValidationError

from pagedllm.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    TokenizeRequest,
)
from pagedllm.sampling_params import REQUEST_FIELDS, RequestOutputKind, SamplingParams

REQUESTS = {
    "completion": (CompletionRequest, {"prompt": "hi"}),
    "chat": (ChatCompletionRequest, {"messages": [{"role": "user", "content": "hi"}]}),
}
LONE = "\ud800"

# A value for every request field, none of them SamplingParams' default.
NON_DEFAULTS = {
    "n": 3,
    "presence_penalty": 0.5,
    "frequency_penalty": -0.5,
    "repetition_penalty": 1.2,
    "temperature": 0.7,
    "top_p": 0.9,
    "top_k": 5,
    "min_p": 0.1,
    "seed": 42,
    "stop": ["x", "yz"],
    "stop_token_ids": [7],
    "ignore_eos": True,
    "min_tokens": 2,
    "skip_special_tokens": False,
    "spaces_between_special_tokens": False,
    "include_stop_str_in_output": True,
    "logit_bias": {5: 1.5},
    "allowed_token_ids": [1, 2],
    "bad_words": ["bad"],
    "truncate_prompt_tokens": 12,
}


def sampling_defaults() -> dict[str, object]:
    return {f.name: f.default for f in dataclasses.fields(SamplingParams)}


@pytest.mark.parametrize("kind", REQUESTS)
def test_every_request_field_of_sampling_params_with_its_default(kind: str) -> None:
    model, required = REQUESTS[kind]
    request = model(**required)
    defaults = sampling_defaults()
    for name in REQUEST_FIELDS:
        assert name in model.model_fields, name
        assert getattr(request, name) == defaults[name], name


@pytest.mark.parametrize("kind", REQUESTS)
def test_sampling_params_passes_every_field_through(kind: str) -> None:
    """The request's SamplingParams equals one built directly from the same values."""
    assert set(NON_DEFAULTS) == set(REQUEST_FIELDS)
    defaults = sampling_defaults()
    assert all(NON_DEFAULTS[name] != defaults[name] for name in REQUEST_FIELDS)
    model, required = REQUESTS[kind]
    body = {**required, **NON_DEFAULTS, "logit_bias": {"5": 1.5}}  # JSON keys are strings
    params = model.model_validate(body).sampling_params(7, logprobs=2, prompt_logprobs=3)
    expected = SamplingParams(
        **NON_DEFAULTS,
        max_tokens=7,
        logprobs=2,
        prompt_logprobs=3,
        output_kind=RequestOutputKind.DELTA,
    )
    assert params == expected


def test_sampling_params_range_errors_name_the_field() -> None:
    """Types are pydantic's to check, ranges SamplingParams': its message names the field."""
    with pytest.raises(ValueError, match="^temperature"):
        CompletionRequest(prompt="a", temperature=-1).sampling_params(4, None)


@pytest.mark.parametrize(
    "field, literal",
    [
        ("temperature", "NaN"),
        ("temperature", "Infinity"),
        ("top_p", "-Infinity"),
        ("presence_penalty", '"nan"'),
        ("frequency_penalty", '"inf"'),
    ],
)
def test_nan_and_infinity_are_rejected_naming_the_field(field: str, literal: str) -> None:
    with pytest.raises(ValidationError) as info:
        CompletionRequest.model_validate_json(f'{{"prompt": "a", "{field}": {literal}}}')
    assert [e["loc"] for e in info.value.errors()] == [(field,)]


def test_nan_inside_logit_bias_is_rejected() -> None:
    with pytest.raises(ValidationError) as info:
        CompletionRequest.model_validate_json('{"prompt": "a", "logit_bias": {"5": NaN}}')
    assert info.value.errors()[0]["loc"][0] == "logit_bias"


@pytest.mark.parametrize(
    "model, body, field",
    [
        (CompletionRequest, {"prompt": LONE + "x"}, "prompt"),
        (CompletionRequest, {"prompt": ["ok", "x" + LONE]}, "prompt"),
        (CompletionRequest, {"prompt": "a", "stop": ["ok", LONE]}, "stop"),
        (CompletionRequest, {"prompt": "a", "bad_words": [LONE]}, "bad_words"),
        (CompletionRequest, {"prompt": "a", "user": LONE}, "user"),
        (ChatCompletionRequest, {"messages": [{"role": "user", "content": LONE}]}, "content"),
        (ChatCompletionRequest, {"messages": [{"role": LONE, "content": "a"}]}, "role"),
        (
            ChatCompletionRequest,
            {"messages": [{"role": "user", "content": [{"type": "text", "text": LONE}]}]},
            "text",
        ),
        (TokenizeRequest, {"prompt": LONE}, "prompt"),
    ],
)
def test_lone_surrogates_are_rejected_naming_the_field(model: type, body: dict, field: str) -> None:
    """JSON's "\\ud800" decodes to a str that cannot be tokenized or encoded as UTF-8."""
    with pytest.raises(ValidationError) as info:
        model.model_validate(body)
    messages = [e["msg"] for e in info.value.errors()]
    assert any(f"{field} is not valid Unicode: lone surrogate" in m for m in messages), messages


@pytest.mark.parametrize(
    "field",
    [
        "n",
        "stream",
        "temperature",
        "top_p",
        "presence_penalty",
        "frequency_penalty",
        "top_k",
        "min_p",
        "repetition_penalty",
    ],
)
@pytest.mark.parametrize("kind", REQUESTS)
def test_null_means_the_default(kind: str, field: str) -> None:
    model, required = REQUESTS[kind]
    request = model.model_validate({**required, field: None})
    assert getattr(request, field) == model.model_fields[field].default
    assert getattr(request, field) is not None


def test_null_is_not_accepted_for_other_required_types() -> None:
    """Only the fields OpenAI documents as nullable, and vLLM's top_k, min_p and
    repetition_penalty, read null as the default."""
    with pytest.raises(ValidationError):
        CompletionRequest(prompt="a", ignore_eos=None)


def test_unknown_fields_are_kept_aside() -> None:
    """OpenAI's clients may send fields newer than this server: the request bodies accept
    them into model_extra, for the server to refuse or log (unsupported_fields.py)."""
    request = CompletionRequest.model_validate({"prompt": "a", "service_tier": "auto"})
    assert request.model_extra == {"service_tier": "auto"}
    assert "service_tier" not in CompletionRequest.model_fields


def test_chat_message_as_template_message() -> None:
    """Text content parts are joined by newlines (vLLM's); no content becomes ""; name only
    when given."""
    parts = ChatMessage(
        role="user", content=[{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]
    )
    assert parts.as_template_message() == {"role": "user", "content": "Hel\nlo"}
    empty = ChatMessage(role="assistant", content=None, name="bot")
    assert empty.as_template_message() == {"role": "assistant", "content": "", "name": "bot"}


def test_tool_calls_and_results_as_template_messages() -> None:
    """As vLLM gives them to templates: a call's arguments as an object (templates write
    `arguments | tojson`) when they parse, a tool result with its tool_call_id."""
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    assistant = ChatMessage(role="assistant", tool_calls=[call]).as_template_message()
    expected = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}
    assert assistant == {"role": "assistant", "content": "", "tool_calls": [expected]}
    text = {**call, "function": {"name": "f", "arguments": "not json"}}
    message = ChatMessage(role="assistant", tool_calls=[text]).as_template_message()
    assert message["tool_calls"][0]["function"]["arguments"] == "not json"
    tool = ChatMessage(role="tool", tool_call_id="c1", content="4")
    assert tool.as_template_message() == {"role": "tool", "content": "4", "tool_call_id": "c1"}


def test_chat_template_kwargs_cannot_set_apply_chat_template_arguments() -> None:
    kwargs = {"tools": [], "tokenize": False, "enable_thinking": False}
    with pytest.raises(ValidationError, match=r"\['tokenize', 'tools'\] are set by the server"):
        ChatCompletionRequest(**REQUESTS["chat"][1], chat_template_kwargs=kwargs)


def test_reasoning_effort_reaches_the_chat_template() -> None:
    """As vLLM: the template gets reasoning_effort (chat_template_kwargs may override it);
    values outside OpenAI's are a 400."""
    chat = REQUESTS["chat"][1]
    assert "reasoning_effort" not in ChatCompletionRequest(**chat).template_kwargs()
    request = ChatCompletionRequest(**chat, reasoning_effort="low")
    assert request.template_kwargs()["reasoning_effort"] == "low"
    override = {"reasoning_effort": "high"}
    request = ChatCompletionRequest(**chat, reasoning_effort="low", chat_template_kwargs=override)
    assert request.template_kwargs()["reasoning_effort"] == "high"
    with pytest.raises(ValidationError):
        ChatCompletionRequest(**chat, reasoning_effort="extreme")


def test_chat_message_refuses_non_text_parts() -> None:
    with pytest.raises(ValidationError):
        ChatMessage(role="user", content=[{"type": "image_url", "image_url": {}}])


@pytest.mark.parametrize(
    "fields, expected",
    [({}, None), ({"max_tokens": 5}, 5), ({"max_tokens": 5, "max_completion_tokens": 9}, 9)],
)
def test_max_completion_tokens_wins_over_max_tokens(fields: dict, expected: int | None) -> None:
    model, required = REQUESTS["chat"]
    assert model(**required, **fields).requested_max_tokens == expected


def test_chat_needs_a_message_and_top_logprobs_is_not_negative() -> None:
    with pytest.raises(ValidationError):
        ChatCompletionRequest(messages=[])
    with pytest.raises(ValidationError):
        ChatCompletionRequest(**REQUESTS["chat"][1], top_logprobs=-1)


def test_include_usage_from_stream_options() -> None:
    assert not CompletionRequest(prompt="a").include_usage
    assert not CompletionRequest(prompt="a", stream=True, stream_options={}).include_usage
    usage = {"include_usage": True}
    assert CompletionRequest(prompt="a", stream=True, stream_options=usage).include_usage
    continuous = {"include_usage": True, "continuous_usage_stats": True}
    assert CompletionRequest(prompt="a", stream=True, stream_options=continuous).continuous_usage
    assert not CompletionRequest(prompt="a", stream=True, stream_options=usage).continuous_usage


def test_stream_options_need_a_stream_and_known_keys() -> None:
    """vLLM refuses stream_options without stream; an unknown key is refused, not dropped."""
    with pytest.raises(ValidationError, match="only be set when stream is true"):
        CompletionRequest(prompt="a", stream_options={"include_usage": True})
    with pytest.raises(ValidationError, match="include_usge"):
        CompletionRequest(prompt="a", stream=True, stream_options={"include_usge": True})
    assert CompletionRequest(prompt="a", stream=True, stream_options={"include_obfuscation": True})


def test_completion_defaults_follow_openai() -> None:
    """OpenAI's legacy completions default to 16 tokens; chat to no limit (None)."""
    assert CompletionRequest(prompt="a").max_tokens == 16
    assert ChatCompletionRequest(**REQUESTS["chat"][1]).max_tokens is None


def test_structured_outputs_keys_it_does_not_have_are_refused() -> None:
    """Nothing dropped silently: pydantic would ignore a dataclass's unknown keys."""
    body = {"prompt": "a", "structured_outputs": {"json": {"type": "object"}, "jsn": {}}}
    with pytest.raises(ValidationError, match=r"unknown fields \['jsn'\]"):
        CompletionRequest.model_validate(body)
