"""pagedllm/entrypoints/openai/responses_input.py: Responses API input items -> chat
messages and the chat request (reference: OpenAI's mapping of the two APIs in its
"Migrate to the Responses API" guide: instructions are the system message, function_call
items the assistant's tool_calls, function_call_output items tool messages)."""

import pytest

from pagedllm.entrypoints.openai.errors import OpenAIError
from pagedllm.entrypoints.openai.responses_input import (
    assistant_message,
    chat_request_of,
    conversation_of,
)
from pagedllm.entrypoints.openai.responses_protocol import (
    OutputFunctionCall,
    OutputMessage,
    OutputReasoning,
    OutputText,
    ReasoningText,
    ResponsesRequest,
)


def messages(body: dict) -> list[dict]:
    request = ResponsesRequest.model_validate(body)
    chat = chat_request_of(request, conversation_of(request.input))
    return [m.as_template_message() for m in chat.messages]


def test_a_string_input_is_a_user_message_under_the_instructions() -> None:
    assert messages({"input": "Hi", "instructions": "Be brief."}) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
    ]


def test_items_become_messages_calls_and_tool_results() -> None:
    items = [
        {"role": "developer", "content": "Use tools."},
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "Weather "},
                {"type": "input_text", "text": "in Paris?"},
            ],
        },
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "Call it."}],
        },
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Checking.", "annotations": []}],
        },
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city": "Paris"}',
        },
        {"type": "function_call", "call_id": "call_2", "name": "get_time", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "18 C"},
        {"type": "function_call_output", "call_id": "call_2", "output": "noon"},
    ]
    assert messages({"input": items}) == [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "reasoning_content": "Call it.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "get_time", "arguments": {}},
                },
            ],
        },
        {"role": "tool", "content": "18 C", "tool_call_id": "call_1"},
        {"role": "tool", "content": "noon", "tool_call_id": "call_2"},
    ]


def test_tools_choice_and_format_become_the_chat_fields() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    body = {
        "input": "Hi",
        "tools": [{"type": "function", "name": "f", "parameters": schema, "strict": True}],
        "tool_choice": {"type": "function", "name": "f"},
        "text": {"format": {"type": "json_schema", "name": "out", "schema": schema}},
        "max_output_tokens": 7,
        "reasoning": {"effort": "low"},
    }
    request = ResponsesRequest.model_validate(body)
    chat = chat_request_of(request, conversation_of(request.input))
    assert chat.tools[0].function.name == "f" and chat.tools[0].function.parameters == schema
    assert chat.tool_choice.function.name == "f"
    assert chat.response_format.json_schema.json_schema == schema
    assert chat.requested_max_tokens == 7 and chat.reasoning_effort == "low"


def test_bad_inputs_are_400s() -> None:
    with pytest.raises(OpenAIError, match="input is empty"):
        messages({"input": []})
    with pytest.raises(OpenAIError, match="needs schema"):
        messages({"input": "x", "text": {"format": {"type": "json_schema", "name": "n"}}})
    with pytest.raises(ValueError, match="conversation is not supported"):
        ResponsesRequest.model_validate({"input": "x", "conversation": "conv_1"})
    with pytest.raises(ValueError, match="truncation is not supported"):
        ResponsesRequest.model_validate({"input": "x", "truncation": "auto"})
    quiet = {"truncation": "disabled", "top_logprobs": 0, "include": ["x"], "conversation": None}
    assert ResponsesRequest.model_validate({"input": "x", **quiet}).input == "x"
    with pytest.raises(ValueError, match="input_image"):
        ResponsesRequest.model_validate(
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]}
        )


def test_a_responses_output_continues_as_one_assistant_message() -> None:
    output = [
        OutputReasoning(content=[ReasoningText(text="Hmm.")]),
        OutputMessage(content=[OutputText(text="Sure.")]),
        OutputFunctionCall(call_id="call_9", name="f", arguments="{}"),
    ]
    message = assistant_message(output).as_template_message()
    assert message == {
        "role": "assistant",
        "content": "Sure.",
        "reasoning_content": "Hmm.",
        "tool_calls": [
            {"id": "call_9", "type": "function", "function": {"name": "f", "arguments": {}}}
        ],
    }
    assert assistant_message([]) is None
