"""POST /v1/messages and /v1/messages/count_tokens (serving_messages.py) with the official
`anthropic` client on the default model, in process (the app behind a TestClient as the
client's http client). References: Anthropic's Messages API as the SDK parses it; the
non-streamed answer for the streamed one (greedy); jsonschema for forced tool inputs; the
tokenizer's own apply_chat_template for the token count."""

import json
from collections.abc import Iterator

import anthropic
import jsonschema
import pytest
from fastapi.testclient import TestClient

from pagedllm import LLM
from pagedllm.engine.async_llm import AsyncLLM
from pagedllm.entrypoints.openai import api_server
from tests.entrypoints.openai.remote_server import MAX_MODEL_LEN, MODEL_NAME

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [{"name": "get_weather", "description": "The weather now", "input_schema": WEATHER}]
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
# The SDK no longer declares the sampling fields; the server still reads them.
ASK = dict(model=MODEL_NAME, max_tokens=40, extra_body={"temperature": 0})
KEY = "secret"


def anthropic_client(http: TestClient, api_key: str = "unused") -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url="http://testserver", api_key=api_key, http_client=http, max_retries=0
    )


@pytest.fixture(scope="module")
def http(offline_llm: LLM) -> Iterator[TestClient]:
    app = api_server.build_app(AsyncLLM(offline_llm.llm_engine), [MODEL_NAME])
    with TestClient(app) as c:
        yield c


@pytest.fixture(scope="module")
def client(http: TestClient) -> anthropic.Anthropic:
    return anthropic_client(http)


def test_create_answers_a_text_message_with_usage(client: anthropic.Anthropic) -> None:
    message = client.messages.create(**ASK, system="Be brief.", messages=QUESTION)
    assert message.id.startswith("msg_") and message.type == "message"
    assert message.role == "assistant" and message.model == MODEL_NAME
    (block,) = message.content
    assert block.type == "text" and block.text
    assert message.stop_reason in ("end_turn", "max_tokens") and message.stop_sequence is None
    assert 0 < message.usage.output_tokens <= ASK["max_tokens"]
    counted = client.messages.count_tokens(model=MODEL_NAME, system="Be brief.", messages=QUESTION)
    assert message.usage.input_tokens == counted.input_tokens


def test_max_tokens_and_stop_sequences_name_the_stop(client: anthropic.Anthropic) -> None:
    short = client.messages.create(**{**ASK, "max_tokens": 3}, messages=QUESTION)
    assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 3
    text = client.messages.create(**ASK, messages=QUESTION).content[0].text
    word = text.split()[2]
    stopped = client.messages.create(**ASK, messages=QUESTION, stop_sequences=[word])
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == word
    assert stopped.content[0].text == text[: text.index(word)]


def test_a_last_assistant_message_is_continued(
    client: anthropic.Anthropic, http: TestClient
) -> None:
    """Reference: /v1/chat/completions with continue_final_message."""
    prefill = [*QUESTION, {"role": "assistant", "content": "The weather in Paris is"}]
    message = client.messages.create(**ASK, messages=prefill)
    chat = {"model": MODEL_NAME, "messages": prefill, "max_tokens": 40, "temperature": 0}
    chat |= {"add_generation_prompt": False, "continue_final_message": True}
    expected = http.post("/v1/chat/completions", json=chat).json()["choices"][0]["message"]
    assert message.content[0].text == expected["content"]


def test_max_tokens_past_the_context_window_is_capped(client: anthropic.Anthropic) -> None:
    """A large max_tokens (as agents send) answers; when the window runs out first, the
    stop reason says so. Reference: chat's max_tokens rule (prompt + max_tokens <=
    max_model_len)."""
    with client.messages.stream(**{**ASK, "max_tokens": 32000}, messages=QUESTION) as stream:
        assert stream.get_final_message().stop_reason == "end_turn"  # 32000: Claude Code's
    words = MAX_MODEL_LEN
    for _ in range(4):  # as many words as leave 4 tokens of room
        long = [{"role": "user", "content": "Repeat: " + "apple " * words}]
        room = (
            MAX_MODEL_LEN
            - client.messages.count_tokens(model=MODEL_NAME, messages=long).input_tokens
        )
        words += room - 4
    assert room == 4
    cut = client.messages.create(**{**ASK, "max_tokens": 100}, messages=long)
    assert cut.stop_reason == "model_context_window_exceeded"
    assert cut.usage.output_tokens == 4


def test_streamed_text_deltas_reassemble_the_whole_answer(client: anthropic.Anthropic) -> None:
    whole = client.messages.create(**ASK, messages=QUESTION)
    with client.messages.stream(**ASK, messages=QUESTION) as stream:
        pieces = list(stream.text_stream)
        streamed = stream.get_final_message()
    assert len(pieces) > 1 and "".join(pieces) == whole.content[0].text
    assert [b.text for b in streamed.content] == [b.text for b in whole.content]
    assert streamed.stop_reason == whole.stop_reason
    assert streamed.usage.input_tokens == whole.usage.input_tokens
    assert streamed.usage.output_tokens == whole.usage.output_tokens


def test_the_stream_has_anthropic_s_event_sequence(http: TestClient) -> None:
    body = {"model": MODEL_NAME, "messages": QUESTION, "stream": True, "max_tokens": 5}
    with http.stream("POST", "/v1/messages", json=body) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line.startswith("event: ")]
    names = [line.removeprefix("event: ") for line in lines]
    assert names[:4] == ["message_start", "ping", "content_block_start", "content_block_delta"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]


def test_a_stop_sequence_that_cuts_a_tool_use_short_is_the_stop_reason(
    client: anthropic.Anthropic,
) -> None:
    forced = dict(**ASK, messages=QUESTION, tools=TOOLS, stop_sequences=["city"])
    forced["tool_choice"] = {"type": "tool", "name": "get_weather"}
    message = client.messages.create(**forced)
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == "city"
    with client.messages.stream(**forced) as stream:
        streamed = stream.get_final_message()
    assert streamed.stop_reason == "stop_sequence" and streamed.stop_sequence == "city"


def test_a_forced_tool_round_trip(client: anthropic.Anthropic) -> None:
    """tool_choice "tool" forces a tool_use whose input follows input_schema, streamed
    alike; its tool_result goes back and the model answers in text."""
    forced = dict(**ASK, messages=QUESTION, tools=TOOLS)
    forced["tool_choice"] = {"type": "tool", "name": "get_weather"}
    forced["max_tokens"] = 60
    message = client.messages.create(**forced)
    assert message.stop_reason == "tool_use"
    (call,) = [block for block in message.content if block.type == "tool_use"]
    assert call.id.startswith("toolu_") and call.name == "get_weather"
    jsonschema.validate(call.input, WEATHER)
    with client.messages.stream(**forced) as stream:
        streamed = stream.get_final_message()
    assert [b.input for b in streamed.content if b.type == "tool_use"] == [call.input]
    result = {"type": "tool_result", "tool_use_id": call.id, "content": "18 degrees, sunny"}
    conversation = [
        *QUESTION,
        {"role": "assistant", "content": [call.model_dump()]},
        {"role": "user", "content": [result]},
    ]
    answer = client.messages.create(
        **ASK, messages=conversation, tools=TOOLS, tool_choice={"type": "none"}
    )
    assert answer.content[0].type == "text" and answer.content[0].text
    assert answer.stop_reason in ("end_turn", "max_tokens")


def test_output_config_format_constrains_the_answer(client: anthropic.Anthropic) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "London"]}},
        "required": ["city"],
        "additionalProperties": False,
    }
    output_config = {"format": {"type": "json_schema", "schema": schema}}
    message = client.messages.create(**ASK, messages=QUESTION, output_config=output_config)
    jsonschema.validate(json.loads(message.content[0].text), schema)


def test_count_tokens_is_the_prompt_messages_sends(
    client: anthropic.Anthropic, offline_llm: LLM
) -> None:
    """The count equals a message's input_tokens for the same body (with tools and no
    tool_choice on the default model: the generic format's system prompt included); with
    tool_choice none, transformers' apply_chat_template on the equivalent chat messages."""
    body = dict(system="Be brief.", messages=QUESTION, tools=TOOLS)
    counted = client.messages.count_tokens(model=MODEL_NAME, **body)
    created = client.messages.create(**{**ASK, "max_tokens": 1}, **body)
    assert counted.input_tokens == created.usage.input_tokens
    none = client.messages.count_tokens(model=MODEL_NAME, **body, tool_choice={"type": "none"})
    conversation = [{"role": "system", "content": "Be brief."}, *QUESTION]
    tools = [{"type": "function", "function": {**TOOLS[0], "parameters": WEATHER}}]
    del tools[0]["function"]["input_schema"]
    expected = offline_llm.get_tokenizer().apply_chat_template(
        conversation, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert none.input_tokens == len(expected) < counted.input_tokens


def test_errors_are_anthropic_s(client: anthropic.Anthropic, http: TestClient) -> None:
    with pytest.raises(anthropic.BadRequestError) as missing:  # the SDK's checks passed by
        body = {"model": MODEL_NAME, "messages": QUESTION}
        client.post("/v1/messages", body=body, cast_to=anthropic.types.Message)
    assert missing.value.body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in missing.value.body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError) as unknown:
        client.messages.create(**{**ASK, "model": "claude-nope"}, messages=QUESTION)
    assert unknown.value.body == {
        "type": "error",
        "error": {"type": "not_found_error", "message": unknown.value.body["error"]["message"]},
    }
    with pytest.raises(anthropic.BadRequestError) as image:
        client.messages.create(
            **ASK,
            messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}],
        )
    assert image.value.body["error"]["type"] == "invalid_request_error"
    assert http.post("/v1/chat/completions", json={}).json()["error"]["param"] == "messages"
    use = {"type": "tool_use", "id": "toolu_a", "name": "get_weather", "input": {"city": "P"}}
    result = {"type": "tool_result", "tool_use_id": "toolu_zzz", "content": "sunny"}
    with pytest.raises(anthropic.BadRequestError, match="'toolu_zzz' answers no call"):
        client.messages.create(
            **ASK,
            tools=TOOLS,
            messages=[
                *QUESTION,
                {"role": "assistant", "content": [use]},
                {"role": "user", "content": [result]},
            ],
        )


def test_x_api_key_guards_the_messages_routes(offline_llm: LLM) -> None:
    app = api_server.build_app(AsyncLLM(offline_llm.llm_engine), [MODEL_NAME], api_key=[KEY])
    with TestClient(app) as http:
        answer = anthropic_client(http, KEY).messages.create(
            **{**ASK, "max_tokens": 2}, messages=QUESTION
        )
        assert answer.usage.output_tokens == 2
        with pytest.raises(anthropic.AuthenticationError) as refused:
            anthropic_client(http, "wrong").messages.count_tokens(
                model=MODEL_NAME, messages=QUESTION
            )
    assert refused.value.body["error"]["type"] == "authentication_error"
