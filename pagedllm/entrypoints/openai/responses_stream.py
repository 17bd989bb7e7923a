"""OutputItems: an answer's chat deltas -> the Responses API's output items and the events
that build them, in OpenAI's order.

Each kind of delta (reasoning, text, a tool call's first piece) opens an item, closing the
one before it:

    reasoning      output_item.added, content_part.added, reasoning_text.delta ...,
                   reasoning_text.done, content_part.done, output_item.done
    message        output_item.added, content_part.added, output_text.delta ...,
                   output_text.done, content_part.done, output_item.done
    function_call  output_item.added, function_call_arguments.delta ...,
                   function_call_arguments.done, output_item.done

A whole answer goes through the same path as one delta, so a stream adds up to the
non-streamed output. Events are dicts without `sequence_number`; the SSE writer numbers
them.
"""

from typing import Any

from pagedllm.entrypoints.openai.responses import (
    AssistantMessage,
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
)
from pagedllm.entrypoints.openai.responses_protocol import (
    ItemStatus,
    OutputFunctionCall,
    OutputItem,
    OutputMessage,
    OutputReasoning,
    OutputText,
    ReasoningText,
)

Event = dict[str, Any]


class OutputItems:
    def __init__(self) -> None:
        self.items: list[OutputItem] = []
        self._open: OutputItem | None = None
        self._calls: dict[int, OutputFunctionCall] = {}  # by the chat delta's call index

    def feed(self, delta: DeltaMessage) -> list[Event]:
        events = []
        if delta.reasoning_content:
            events += self._text(OutputReasoning, delta.reasoning_content)
        if delta.content:
            events += self._text(OutputMessage, delta.content)
        for call in delta.tool_calls or []:
            events += self._call(call)
        return events

    def finish(self, status: ItemStatus) -> list[Event]:
        """Close the last item with `status` ("incomplete" when the answer was cut)."""
        return self._close(status)

    def _text(self, kind: type[OutputMessage | OutputReasoning], text: str) -> list[Event]:
        events = []
        if not isinstance(self._open, kind):
            part = OutputText() if kind is OutputMessage else ReasoningText()
            events = [*self._close(), *self._add(kind(content=[part]))]
            events.append(self._item_event("response.content_part.added", part=part.model_dump()))
        item = self._open
        item.content[0].text += text
        delta_type = _text_event(item) + ".delta"
        events.append(self._item_event(delta_type, delta=text, **_logprobs(item)))
        return events

    def _call(self, piece: DeltaToolCall) -> list[Event]:
        events = []
        if piece.function.name is not None:
            call = OutputFunctionCall(name=piece.function.name)
            self._calls[piece.index] = call
            events = [*self._close(), *self._add(call)]
        call = self._calls[piece.index]
        if piece.function.arguments:
            call.arguments += piece.function.arguments
            delta = piece.function.arguments
            events.append(self._item_event("response.function_call_arguments.delta", delta=delta))
        return events

    def _add(self, item: OutputItem) -> list[Event]:
        self.items.append(item)
        self._open = item
        return [self._item_done_or_added(item, "response.output_item.added")]

    def _close(self, status: ItemStatus = "completed") -> list[Event]:
        item, self._open = self._open, None
        if item is None:
            return []
        item.status = status
        if isinstance(item, OutputFunctionCall):
            done = self._event(item, "response.function_call_arguments.done")
            done |= {"name": item.name, "arguments": item.arguments}
            events = [done]
        else:
            part = item.content[0]
            text_done = self._event(item, _text_event(item) + ".done", content_index=0)
            text_done |= {"text": part.text, **_logprobs(item)}
            part_done = self._event(item, "response.content_part.done", content_index=0)
            events = [text_done, part_done | {"part": part.model_dump()}]
        events.append(self._item_done_or_added(item, "response.output_item.done"))
        return events

    def _item_done_or_added(self, item: OutputItem, type: str) -> Event:
        return {"type": type, "output_index": self.items.index(item), "item": item.model_dump()}

    def _item_event(self, type: str, **fields: Any) -> Event:
        """An event of the open item; a text item's events name its one content part."""
        item = self._open
        event = self._event(item, type)
        if not isinstance(item, OutputFunctionCall):
            event["content_index"] = 0
        return event | fields

    def _event(self, item: OutputItem, type: str, **fields: Any) -> Event:
        output_index = self.items.index(item)
        return {"type": type, "item_id": item.id, "output_index": output_index, **fields}


def _text_event(item: OutputMessage | OutputReasoning) -> str:
    return "response.output_text" if isinstance(item, OutputMessage) else "response.reasoning_text"


def _logprobs(item: OutputItem) -> dict[str, Any]:
    """OpenAI's text events carry `logprobs` (empty unless asked); reasoning's do not."""
    return {"logprobs": []} if isinstance(item, OutputMessage) else {}


def output_items(message: AssistantMessage, status: ItemStatus) -> list[OutputItem]:
    """A whole chat answer's output items."""
    calls = [
        DeltaToolCall(index=i, function=DeltaFunctionCall(**c.function.model_dump()))
        for i, c in enumerate(message.tool_calls or [])
    ]
    delta = DeltaMessage(
        content=message.content, reasoning_content=message.reasoning_content, tool_calls=calls
    )
    items = OutputItems()
    items.feed(delta)
    items.finish(status)
    return items.items
