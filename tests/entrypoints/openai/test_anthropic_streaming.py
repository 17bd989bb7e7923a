"""A streamed answer's content block events (anthropic_streaming.py). Reference: the
event sequence of Anthropic's streaming Messages API: a block per thinking run, text run
and tool call, each started before its deltas and stopped before the next starts."""

import asyncio
from collections.abc import AsyncIterator

from pagedllm.entrypoints.openai.anthropic_streaming import (
    ContentBlockEvents,
    Event,
    _frame,
    _frames,
)
from pagedllm.entrypoints.openai.chat_choice_parser import ChoiceDelta
from pagedllm.entrypoints.openai.tool_parsers import ToolCallDelta


def test_thinking_text_and_tool_calls_are_blocks_in_order() -> None:
    blocks = ContentBlockEvents()
    events = blocks.feed(ChoiceDelta(reasoning="Hmm."))
    events += blocks.feed(ChoiceDelta(reasoning=" Yes.", content="Let me "))
    events += blocks.feed(ChoiceDelta(content="look.", tool_calls=[ToolCallDelta(0, "f", "")]))
    events += blocks.feed(ChoiceDelta(tool_calls=[ToolCallDelta(0, None, '{"a": ')]))
    events += blocks.feed(ChoiceDelta(tool_calls=[ToolCallDelta(0, None, "1}")]))
    events += blocks.feed(ChoiceDelta(tool_calls=[ToolCallDelta(1, "g", "{}")]))
    events += blocks.stop()
    assert blocks.stop() == []
    shown = [
        (name, data["index"], data.get("delta") or data.get("content_block"))
        for name, data in events
    ]
    tool_f, tool_g = shown[8][2], shown[12][2]
    assert tool_f["id"].startswith("toolu_") and tool_f["id"] != tool_g["id"]
    assert shown == [
        ("content_block_start", 0, {"type": "thinking", "thinking": "", "signature": ""}),
        ("content_block_delta", 0, {"type": "thinking_delta", "thinking": "Hmm."}),
        ("content_block_delta", 0, {"type": "thinking_delta", "thinking": " Yes."}),
        ("content_block_stop", 0, None),
        ("content_block_start", 1, {"type": "text", "text": ""}),
        ("content_block_delta", 1, {"type": "text_delta", "text": "Let me "}),
        ("content_block_delta", 1, {"type": "text_delta", "text": "look."}),
        ("content_block_stop", 1, None),
        (
            "content_block_start",
            2,
            {"type": "tool_use", "id": tool_f["id"], "name": "f", "input": {}},
        ),
        ("content_block_delta", 2, {"type": "input_json_delta", "partial_json": '{"a": '}),
        ("content_block_delta", 2, {"type": "input_json_delta", "partial_json": "1}"}),
        ("content_block_stop", 2, None),
        (
            "content_block_start",
            3,
            {"type": "tool_use", "id": tool_g["id"], "name": "g", "input": {}},
        ),
        ("content_block_delta", 3, {"type": "input_json_delta", "partial_json": "{}"}),
        ("content_block_stop", 3, None),
    ]


def test_a_frame_names_its_event_and_is_ascii() -> None:
    frame = _frame("content_block_delta", {"text": "caf\u00e9 \ud800"})
    assert frame == 'event: content_block_delta\ndata: {"text": "caf\\u00e9 \\ud800"}\n\n'
    assert frame.isascii()


def test_an_error_after_the_start_is_an_error_event() -> None:
    async def failing() -> AsyncIterator[Event]:
        yield "ping", {"type": "ping"}
        raise ValueError("temperature must be >= 0")

    async def frames() -> list[str]:
        return [frame async for frame in _frames(failing())]

    error = {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "temperature must be >= 0"},
    }
    assert asyncio.run(frames()) == [_frame("ping", {"type": "ping"}), _frame("error", error)]
