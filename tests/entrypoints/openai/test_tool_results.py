"""pagedllm/entrypoints/openai/tool_results.py. Reference: OpenAI's chat API, which refuses
a tool message that does not follow an assistant message with tool_calls, and Anthropic's,
which refuses a tool_result whose tool_use_id is no tool_use of the message before it."""

import pytest

from pagedllm.entrypoints.openai.errors import OpenAIError
from pagedllm.entrypoints.openai.protocol import ChatMessage
from pagedllm.entrypoints.openai.tool_results import check_tool_results

USER = {"role": "user", "content": "weather in Paris and Rome?"}
CALLS = {
    "role": "assistant",
    "tool_calls": [
        {"id": "a", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "b", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}},
    ],
}


def tool(call_id: str | None) -> dict:
    return {"role": "tool", "tool_call_id": call_id, "content": "sunny"}


def messages(*dicts: dict) -> list[ChatMessage]:
    return [ChatMessage(**d) for d in dicts]


@pytest.mark.parametrize(
    "conversation",
    [
        [USER, CALLS, tool("a"), tool("b")],
        [USER, CALLS, tool("b")],  # a call left without a result
        [USER, CALLS, tool(None), tool(None)],  # templates that need no ids
        [USER, CALLS, tool("a"), {"role": "assistant", "content": "ok"}, USER],
    ],
)
def test_results_of_the_calls_before_them_pass(conversation: list[dict]) -> None:
    check_tool_results(messages(*conversation))


@pytest.mark.parametrize(
    ("conversation", "message"),
    [
        ([tool("a")], "'a' does not follow an assistant message with tool calls"),
        ([USER, {"role": "assistant", "content": "hi"}, tool(None)], "without an id does not"),
        ([USER, CALLS, USER, tool("a")], "'a' does not follow"),
        ([USER, CALLS, tool("a"), tool("zzz")], "'zzz' answers no call .* 'a', 'b'"),
    ],
)
def test_a_result_of_no_call_is_a_400_naming_it(conversation: list[dict], message: str) -> None:
    with pytest.raises(OpenAIError, match=message) as error:
        check_tool_results(messages(*conversation), "input")
    assert error.value.status_code == 400 and error.value.param == "input"
