"""OutputItems of pagedllm/entrypoints/openai/responses_stream.py: chat deltas -> output
items and events in OpenAI's Responses streaming order (reference: the event sequence of
OpenAI's API reference, "Streaming events"), and a whole answer -> the same items."""

from pagedllm.entrypoints.openai.responses import (
    AssistantMessage,
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    FunctionCall,
    ToolCall,
)
from pagedllm.entrypoints.openai.responses_stream import OutputItems, output_items


def piece(index: int, name: str | None = None, arguments: str | None = None) -> DeltaToolCall:
    return DeltaToolCall(index=index, function=DeltaFunctionCall(name=name, arguments=arguments))


def stream(deltas: list[DeltaMessage], status: str = "completed") -> tuple[OutputItems, list]:
    items = OutputItems()
    events = [event for delta in deltas for event in items.feed(delta)]
    return items, events + items.finish(status)


def test_reasoning_text_and_calls_follow_openais_event_order() -> None:
    deltas = [
        DeltaMessage(reasoning_content="Think"),
        DeltaMessage(reasoning_content="ing."),
        DeltaMessage(content="Hello"),
        DeltaMessage(content=" there"),
        DeltaMessage(tool_calls=[piece(0, "get_time", '{"city"')]),
        DeltaMessage(tool_calls=[piece(0, arguments=': "Paris"}')]),
        DeltaMessage(tool_calls=[piece(1, "get_weather", "{}")]),
    ]
    items, events = stream(deltas)
    assert [e["type"].removeprefix("response.") for e in events] == [
        "output_item.added",
        "content_part.added",
        "reasoning_text.delta",
        "reasoning_text.delta",
        "reasoning_text.done",
        "content_part.done",
        "output_item.done",
        "output_item.added",
        "content_part.added",
        "output_text.delta",
        "output_text.delta",
        "output_text.done",
        "content_part.done",
        "output_item.done",
        "output_item.added",
        "function_call_arguments.delta",
        "function_call_arguments.delta",
        "function_call_arguments.done",
        "output_item.done",
        "output_item.added",
        "function_call_arguments.delta",
        "function_call_arguments.done",
        "output_item.done",
    ]
    assert [e["output_index"] for e in events] == [0] * 7 + [1] * 7 + [2] * 5 + [3] * 4
    reasoning, message, time_call, weather_call = items.items
    assert reasoning.content[0].text == "Thinking." and events[4]["text"] == "Thinking."
    assert message.content[0].text == "Hello there" and events[11]["text"] == "Hello there"
    assert events[9] == {
        "type": "response.output_text.delta",
        "item_id": message.id,
        "output_index": 1,
        "content_index": 0,
        "delta": "Hello",
        "logprobs": [],
    }
    assert time_call.arguments == '{"city": "Paris"}' and time_call.name == "get_time"
    assert events[17]["arguments"] == time_call.arguments
    assert weather_call.call_id.startswith("call_") and weather_call.id.startswith("fc_")
    assert all(item.status == "completed" for item in items.items)
    added, done = events[0]["item"], events[6]["item"]
    assert added["status"] == "in_progress" and done["status"] == "completed"


def test_a_cut_answer_leaves_its_last_item_incomplete() -> None:
    items, events = stream([DeltaMessage(content="Once upon")], status="incomplete")
    assert events[-1]["item"]["status"] == "incomplete"
    assert items.items[0].status == "incomplete"


def test_a_whole_answer_makes_the_items_of_its_stream() -> None:
    call = ToolCall(function=FunctionCall(name="get_time", arguments='{"city": "Paris"}'))
    message = AssistantMessage(content="Hi", reasoning_content="Hmm.", tool_calls=[call])
    whole = output_items(message, "completed")
    streamed, _ = stream(
        [
            DeltaMessage(reasoning_content="Hm"),
            DeltaMessage(reasoning_content="m."),
            DeltaMessage(content="Hi"),
            DeltaMessage(tool_calls=[piece(0, "get_time", '{"city": "Paris"}')]),
        ]
    )

    def shape(item: object) -> dict:
        return item.model_dump(exclude={"id", "call_id"})

    assert [shape(i) for i in whole] == [shape(i) for i in streamed.items]
    assert output_items(AssistantMessage(content=None), "completed") == []
