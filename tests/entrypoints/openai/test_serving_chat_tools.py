"""Tool calling on POST /v1/chat/completions with the default model and the official
`openai` client: a forced tool choice ("required", a named function) answers with calls
whose arguments validate (jsonschema) against the tool's parameters, streamed calls
accumulate to the same calls, and a tool's result goes back through the template. Also the
"no silent drops" contract (a 400 naming an unimplemented field) and the prefix-cache
hits in `usage.prompt_tokens_details.cached_tokens`."""

import json

import jsonschema
import openai
import pytest

from tests.entrypoints.openai.remote_server import MODEL_NAME

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": TIME}},
]
PARAMETERS = {"get_weather": WEATHER, "get_time": TIME}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
ASK = dict(model=MODEL_NAME, messages=MESSAGES, tools=TOOLS, temperature=0, max_tokens=80)


def check_calls(message: object) -> list[tuple[str, dict]]:
    """(name, arguments) of each call, after checking its form and its arguments."""
    calls = []
    for call in message.tool_calls:
        assert call.type == "function" and call.id.startswith("chatcmpl-tool-")
        arguments = json.loads(call.function.arguments)
        jsonschema.validate(arguments, PARAMETERS[call.function.name])
        calls.append((call.function.name, arguments))
    return calls


def test_required_and_named_choices_answer_with_valid_calls(client: openai.OpenAI) -> None:
    required = client.chat.completions.create(**ASK, tool_choice="required").choices[0]
    assert required.finish_reason == "tool_calls" and required.message.content is None
    assert check_calls(required.message)
    named = {"type": "function", "function": {"name": "get_time"}}
    forced = client.chat.completions.create(**ASK, tool_choice=named).choices[0]
    assert forced.finish_reason == "tool_calls"
    assert [name for name, _ in check_calls(forced.message)] == ["get_time"]


@pytest.mark.parametrize("tool_choice", ["required", "get_weather"])
def test_streamed_calls_accumulate_to_the_whole_answer(
    client: openai.OpenAI, tool_choice: str
) -> None:
    if tool_choice != "required":
        tool_choice = {"type": "function", "function": {"name": tool_choice}}
    whole = client.chat.completions.create(**ASK, tool_choice=tool_choice).choices[0]
    with client.chat.completions.stream(**ASK, tool_choice=tool_choice) as stream:
        streamed = stream.get_final_completion().choices[0]
    assert check_calls(streamed.message) == check_calls(whole.message)
    assert streamed.finish_reason == whole.finish_reason


def test_tool_round_trip(client: openai.OpenAI) -> None:
    """The call and its result go back in the conversation; with tool_choice "none" the
    model answers in text, from a prompt that holds both."""
    first = client.chat.completions.create(**ASK, tool_choice="required")
    call = first.choices[0].message.tool_calls[0]
    messages = [
        *MESSAGES,
        {"role": "assistant", "tool_calls": [call.model_dump(exclude={"parsed_arguments"})]},
        {"role": "tool", "tool_call_id": call.id, "content": "18 degrees and sunny"},
    ]
    answer = client.chat.completions.create(
        **{**ASK, "messages": messages, "max_tokens": 8}, tool_choice="none"
    )
    choice = answer.choices[0]
    assert choice.message.content and choice.message.tool_calls is None
    assert choice.finish_reason in ("stop", "length")
    assert answer.usage.prompt_tokens > first.usage.prompt_tokens


def test_bad_tool_choices_are_400_naming_the_field(client: openai.OpenAI) -> None:
    named = {"type": "function", "function": {"name": "get_wether"}}
    with pytest.raises(openai.BadRequestError, match="'get_wether', which is not one") as error:
        client.chat.completions.create(**ASK, tool_choice=named)
    assert error.value.body["param"] == "tool_choice"
    with pytest.raises(openai.BadRequestError, match="requires --enable-auto-tool-choice"):
        client.chat.completions.create(**ASK)  # tools without tool_choice mean "auto"
    with pytest.raises(openai.BadRequestError, match="cannot be combined with response_format"):
        client.chat.completions.create(
            **ASK, tool_choice="required", response_format={"type": "json_object"}
        )


def test_unimplemented_fields_are_400_and_harmless_ones_pass(client: openai.OpenAI) -> None:
    kwargs = dict(model=MODEL_NAME, messages=MESSAGES, max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="best_of is not supported") as error:
        client.chat.completions.create(**kwargs, extra_body={"best_of": 2})
    assert error.value.body["param"] == "best_of"
    ignored = {"metadata": {"k": "v"}, "store": False, "some_future_field": 1}
    assert client.chat.completions.create(**kwargs, extra_body=ignored).choices


def test_cached_tokens_report_prefix_cache_hits(client: openai.OpenAI) -> None:
    prompt = "Count the words of this sentence, which is long enough to fill blocks. " * 6
    kwargs = dict(model=MODEL_NAME, max_tokens=1)
    first = client.completions.create(**kwargs, prompt="Once: " + prompt)
    again = client.completions.create(**kwargs, prompt="Once: " + prompt)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert 0 < cached < again.usage.prompt_tokens and cached % 16 == 0
    chat = [{"role": "user", "content": prompt}]
    client.chat.completions.create(**kwargs, messages=chat)
    stream = client.chat.completions.create(
        **kwargs, messages=chat, stream=True, stream_options={"include_usage": True}
    )
    usage = list(stream)[-1].usage
    assert usage.prompt_tokens_details.cached_tokens > 0
