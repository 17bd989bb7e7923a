"""A streamed Messages answer as Anthropic's server-sent events: `event: NAME` and
`data: {json}` per event, no `[DONE]`; an error once the 200 is out is an `error` event.

`ContentBlockEvents` turns an answer's parsed deltas (chat_choice_parser.py) into the
content_block_start / _delta / _stop events: one block per run of thinking, per run of
text and per tool call, each stopped when the next starts.
"""

import json
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from pagedllm.entrypoints.openai.anthropic_protocol import (
    TextContent,
    ThinkingContent,
    ToolUseContent,
    anthropic_error_body,
)
from pagedllm.entrypoints.openai.chat_choice_parser import ChoiceDelta
from pagedllm.entrypoints.openai.errors import engine_error

Event = tuple[str, dict[str, Any]]  # (the event's name, its data)


class ContentBlockEvents:
    def __init__(self) -> None:
        self.index = -1  # the latest block's
        self.open: str | int | None = None  # "thinking", "text", a tool call's index, None

    def feed(self, delta: ChoiceDelta) -> list[Event]:
        events = []
        if delta.reasoning:
            events += self._into("thinking", ThinkingContent(thinking=""))
            events.append(self._delta({"type": "thinking_delta", "thinking": delta.reasoning}))
        if delta.content:
            events += self._into("text", TextContent(text=""))
            events.append(self._delta({"type": "text_delta", "text": delta.content}))
        for call in delta.tool_calls:
            if call.name is not None:
                events += self._start(call.index, ToolUseContent(name=call.name, input={}))
            assert self.open == call.index, "a tool call's pieces follow its name"
            if call.arguments:
                piece = {"type": "input_json_delta", "partial_json": call.arguments}
                events.append(self._delta(piece))
        return events

    def stop(self) -> list[Event]:
        """The open block's stop, if a block is open."""
        if self.open is None:
            return []
        self.open = None
        return [("content_block_stop", {"type": "content_block_stop", "index": self.index})]

    def _into(self, kind: str, block: BaseModel) -> list[Event]:
        return [] if self.open == kind else self._start(kind, block)

    def _start(self, kind: str | int, block: BaseModel) -> list[Event]:
        events = self.stop()
        self.index += 1
        self.open = kind
        data = {"type": "content_block_start", "index": self.index}
        return events + [("content_block_start", {**data, "content_block": block.model_dump()})]

    def _delta(self, delta: dict[str, Any]) -> Event:
        return "content_block_delta", {
            "type": "content_block_delta",
            "index": self.index,
            "delta": delta,
        }


def anthropic_sse(events: AsyncIterator[Event]) -> StreamingResponse:
    return StreamingResponse(_frames(events), media_type="text/event-stream")


async def _frames(events: AsyncIterator[Event]) -> AsyncIterator[str]:
    async with aclosing(events):
        try:
            async for name, data in events:
                yield _frame(name, data)
        except Exception as e:  # noqa: BLE001 - the 200 is out: the error goes in the stream
            error = engine_error(e)
            body = anthropic_error_body(error.message, error.status_code)
            yield _frame("error", body.model_dump())


def _frame(name: str, data: dict[str, Any]) -> str:
    """JSON in ASCII, so text the client sent (quoted in an error) always encodes."""
    return f"event: {name}\ndata: {json.dumps(data)}\n\n"
