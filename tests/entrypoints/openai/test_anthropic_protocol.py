"""Anthropic's Messages bodies as chat requests (anthropic_protocol.py). Reference:
Anthropic's Messages API and the chat messages vLLM's Anthropic endpoint builds from it
(tool_use -> an assistant's tool_calls, tool_result -> a `tool` message, system -> a
system message); Anthropic's error types per status."""

import pytest
from pydantic import ValidationError

from pagedllm.entrypoints.openai.anthropic_protocol import (
    MessagesRequest,
    anthropic_error_body,
    is_messages_path,
)

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}}


def request(**fields: object) -> MessagesRequest:
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}
    return MessagesRequest.model_validate({**body, **fields})


def test_system_tool_use_and_tool_result_become_chat_messages() -> None:
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Weather in "},
                {"type": "text", "text": "Paris?"},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Use the tool.", "signature": ""},
                {"type": "text", "text": "Let me look."},
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "weather",
                    "input": {"city": "Paris"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": [{"type": "text", "text": "sunny"}],
                },
                {"type": "text", "text": "Thanks"},
            ],
        },
    ]
    chat = request(system=[{"type": "text", "text": "Be brief."}], messages=messages)
    template = [m.as_template_message() for m in chat.as_chat_request().messages]
    assert template == [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": "Weather in \nParis?",
        },  # text blocks joined as vLLM joins parts
        {
            "role": "assistant",
            "content": "Let me look.",
            "reasoning_content": "Use the tool.",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": {"city": "Paris"}},
                }
            ],
        },
        {"role": "tool", "content": "sunny", "tool_call_id": "toolu_1"},
        {"role": "user", "content": "Thanks"},
    ]


def test_a_last_assistant_message_is_continued() -> None:
    prefill = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello,"}]
    continued = request(messages=prefill).as_chat_request()
    assert continued.continue_final_message and not continued.add_generation_prompt
    answered = request().as_chat_request()
    assert answered.add_generation_prompt and not answered.continue_final_message


@pytest.mark.parametrize(
    "choice, chat_choice",
    [
        ({"type": "auto"}, "auto"),
        ({"type": "any"}, "required"),
        ({"type": "none"}, "none"),
        (
            {"type": "tool", "name": "weather"},
            {"type": "function", "function": {"name": "weather"}},
        ),
    ],
)
def test_tools_and_tool_choice_become_functions(choice: dict, chat_choice: object) -> None:
    tools = [{"name": "weather", "description": "Now", "input_schema": SCHEMA}]
    chat = request(tools=tools, tool_choice={**choice, "disable_parallel_tool_use": True})
    fields = chat.chat_fields()
    assert fields["tools"] == [
        {
            "type": "function",
            "function": {"name": "weather", "parameters": SCHEMA, "description": "Now"},
        }
    ]
    assert fields["tool_choice"] == chat_choice and fields["parallel_tool_calls"] is False


def test_sampling_fields_map_and_absent_ones_keep_the_defaults() -> None:
    chat = request(stop_sequences=["\n\n"], temperature=0.5, top_k=4, metadata={"user_id": "u"})
    params = chat.as_chat_request().sampling_params(8, None)
    assert params.stop == ["\n\n"] and params.temperature == 0.5 and params.top_k == 4
    assert params.top_p == 1.0 and params.max_tokens == 8
    assert not request().model_extra and request(thinking={"type": "enabled"}).model_extra


@pytest.mark.parametrize(
    "fields",
    [
        {"max_tokens": None},
        {"max_tokens": 0},
        {"messages": []},
        {"messages": [{"role": "system", "content": "Hi"}]},
        {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
        {"tool_choice": {"type": "tool"}},
        {"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
    ],
    ids=[
        "no-max-tokens",
        "zero-max-tokens",
        "no-messages",
        "system-role",
        "image",
        "unnamed-tool",
        "server-tool",
    ],
)
def test_refused_bodies(fields: dict) -> None:
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}
    body = {key: value for key, value in {**body, **fields}.items() if value is not None}
    with pytest.raises(ValidationError):
        MessagesRequest.model_validate(body)


@pytest.mark.parametrize(
    "status, kind",
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (404, "not_found_error"),
        (413, "request_too_large"),
        (422, "invalid_request_error"),
        (500, "api_error"),
        (503, "overloaded_error"),
    ],
)
def test_error_types_follow_the_status(status: int, kind: str) -> None:
    body = anthropic_error_body("bad", status).model_dump()
    assert body == {"type": "error", "error": {"type": kind, "message": "bad"}}


def test_messages_paths() -> None:
    assert is_messages_path("/v1/messages") and is_messages_path("/v1/messages/count_tokens")
    assert not is_messages_path("/v1/messagesx") and not is_messages_path("/v1/chat/completions")
