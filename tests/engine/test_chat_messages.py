"""engine/chat_messages.py against vLLM's reading of OpenAI messages: text parts joined by
newlines (a null text as ""), null content "", a call's JSON arguments as an object, and
errors that name the message."""

import pytest

from pagedllm.engine.chat_messages import template_message


def test_content_and_calls_as_templates_read_them() -> None:
    parts = [
        {"type": "text", "text": "a"},
        {"type": "text", "text": None},
        {"type": "text", "text": "b"},
    ]
    assert template_message({"role": "user", "content": parts})["content"] == "a\n\nb"
    assert template_message({"role": "assistant", "content": None})["content"] == ""
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
    message = template_message({"role": "assistant", "tool_calls": [call]})
    assert message["tool_calls"][0]["function"]["arguments"] == {"x": 1}


@pytest.mark.parametrize(
    ("message", "words"),
    [
        ("hi", r"messages\[2\] must be a dict"),
        ({"content": "hi"}, r"messages\[2\] needs a role"),
        ({"role": "user", "content": [{"type": "image_url"}]}, "only text parts"),
        ({"role": "user", "content": 5}, "must be a str, a list of text parts or None"),
        ({"role": "assistant", "tool_calls": "f"}, "tool_calls must be a list of dicts"),
    ],
)
def test_messages_templates_cannot_read_are_named(message: object, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        template_message(message, 2)
