"""Tool calling on POST /v1/chat/completions with the default model and the official
`openai` client: a forced tool choice ("required", a named function) and "auto" (the
default with tools; the default model's template has no tool format, so the generic one,
docs/tool-calling.md) answer with calls whose arguments validate (jsonschema) against the
tool's parameters, streamed calls accumulate to the same calls, and a tool's result goes
back through the template. Also the "no silent drops" contract (a 400 naming an
unimplemented field) and the prefix-cache hits in
`usage.prompt_tokens_details.cached_tokens`."""

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
# A request the default model answers with a call at temperature 0 in the generic format.
CALL_MESSAGES = [
    {"role": "user", "content": "Use the get_weather tool to get the weather in Paris in celsius."}
]


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


def test_a_stop_string_that_cuts_a_call_short_ends_it_stop(client: openai.OpenAI) -> None:
    """The forced call's JSON names "city" before its value: the stop string cuts it there,
    and the finish reason says so (as "length" does for max_tokens), streamed alike."""
    named = {"type": "function", "function": {"name": "get_weather"}}
    ask = dict(**ASK, tool_choice=named, stop=["city"])
    whole = client.chat.completions.create(**ask).choices[0]
    assert whole.finish_reason == "stop"
    (call,) = whole.message.tool_calls
    assert call.function.name == "get_weather" and "city" not in call.function.arguments
    with client.chat.completions.stream(**ask) as stream:
        streamed = stream.get_final_completion().choices[0]
    assert streamed.finish_reason == "stop"


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
    with pytest.raises(openai.BadRequestError, match="cannot be combined with response_format"):
        client.chat.completions.create(
            **ASK, tool_choice="required", response_format={"type": "json_object"}
        )
    orphan = [*MESSAGES, {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}]
    with pytest.raises(openai.BadRequestError, match="does not follow an assistant") as error:
        client.chat.completions.create(**{**ASK, "messages": orphan})
    assert error.value.body["param"] == "messages"


def test_auto_is_the_default_and_calls_in_the_generic_format(client: openai.OpenAI) -> None:
    """Tools without tool_choice mean "auto" (OpenAI's default): the default model calls
    a tool at temperature 0, and whatever a sampled answer is, its calls validate."""
    choice = client.chat.completions.create(**{**ASK, "messages": CALL_MESSAGES}).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert [name for name, _ in check_calls(choice.message)] == ["get_weather"]
    sampled = client.chat.completions.create(**{**ASK, "temperature": 1.0, "seed": 3}, n=4)
    for answer in sampled.choices:
        if answer.message.tool_calls:
            assert check_calls(answer.message) and answer.finish_reason == "tool_calls"
        else:
            assert answer.message.content and answer.finish_reason in ("stop", "length")


def test_streamed_auto_calls_accumulate_to_the_whole_answer(client: openai.OpenAI) -> None:
    """The generic format streams each call's name, then its arguments in pieces."""
    ask = {**ASK, "messages": CALL_MESSAGES}
    whole = client.chat.completions.create(**ask, tool_choice="auto").choices[0]
    chunks = list(client.chat.completions.create(**ask, stream=True))
    deltas = [d for c in chunks for d in c.choices[0].delta.tool_calls or []]
    first, *rest = deltas
    assert (first.index, first.type, first.function.name) == (0, "function", "get_weather")
    assert first.id.startswith("chatcmpl-tool-")
    assert len(rest) > 1 and all(d.id is None and d.function.name is None for d in rest)
    arguments = "".join(d.function.arguments for d in deltas)
    assert arguments == whole.message.tool_calls[0].function.arguments
    assert chunks[-1].choices[0].finish_reason == whole.finish_reason == "tool_calls"
    with client.chat.completions.stream(**ask) as stream:
        streamed = stream.get_final_completion().choices[0]
    assert check_calls(streamed.message) == check_calls(whole.message)


def test_auto_answers_in_text_and_none_keeps_tools_out(client: openai.OpenAI) -> None:
    """A greeting gets text under "auto"; "none" neither prompts nor parses the tools."""
    hello = [{"role": "user", "content": "Hi, how are you?"}]
    text = client.chat.completions.create(**{**ASK, "messages": hello}).choices[0]
    assert text.message.tool_calls is None and text.message.content
    assert text.finish_reason in ("stop", "length")
    none = client.chat.completions.create(
        **{**ASK, "messages": CALL_MESSAGES, "max_tokens": 30}, tool_choice="none"
    ).choices[0]
    plain = client.chat.completions.create(
        model=MODEL_NAME, messages=CALL_MESSAGES, temperature=0, max_tokens=30
    ).choices[0]
    assert none.message.tool_calls is None and none.message.content == plain.message.content


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
