"""POST /v1/responses (OpenAI's Responses API) on the chat machinery, and the stored
responses' GET, DELETE and cancel.

A request becomes a chat request (responses_input.py) that OpenAIServingChat prepares and
answers (template, tools, parsers, structured outputs); its message, or its stream of chunks,
becomes the response's output items (responses_stream.py). A stream is SSE with OpenAI's
`event:` lines and `sequence_number`s: response.created, response.in_progress, the items'
events, then response.completed (or response.incomplete when `max_output_tokens` cut the
answer).

With `background: true` (which needs `store`) the request is checked and templated, then
answered at once with the stored response `queued`; a task runs it (`in_progress`, then
`completed`, `incomplete` or `failed`), read with GET and stopped with cancel (`cancelled`,
the engine request aborted). Only a background response still running can be cancelled
(OpenAI's rule). With `stream` too, the task keeps the events it produces with the stored
response (response_events.py): the POST streams them, and GET with `stream=true` (and
`starting_after`) replays them and follows the live ones; no client's disconnection stops
the run. A cancel ends those streams (OpenAI's stream events have no cancelled one).
"""

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import replace
from typing import Literal

from fastapi import Request
from fastapi.responses import StreamingResponse

from pagedllm.entrypoints.openai.errors import OpenAIError, engine_error
from pagedllm.entrypoints.openai.protocol import ChatCompletionRequest, ChatMessage
from pagedllm.entrypoints.openai.response_events import ResponseEvents
from pagedllm.entrypoints.openai.response_items import input_items_of, page
from pagedllm.entrypoints.openai.response_store import ResponseStore, StoredResponse
from pagedllm.entrypoints.openai.responses import (
    ChatCompletionResponse,
    ChatCompletionStreamResponse,
    UsageInfo,
)
from pagedllm.entrypoints.openai.responses_input import (
    assistant_message,
    chat_request_of,
    conversation_of,
)
from pagedllm.entrypoints.openai.responses_protocol import (
    DeletedResponse,
    IncompleteDetails,
    InputItemList,
    InputTokensDetails,
    ItemStatus,
    OutputItem,
    OutputReasoning,
    OutputTokensDetails,
    ResponseError,
    ResponseObject,
    ResponsesRequest,
    ResponseStatus,
    ResponseUsage,
    item_text,
)
from pagedllm.entrypoints.openai.responses_stream import Event, OutputItems, output_items
from pagedllm.entrypoints.openai.serving_chat import ChatRun, OpenAIServingChat


class OpenAIServingResponses:
    def __init__(self, chat: OpenAIServingChat, store: ResponseStore) -> None:
        self.chat = chat
        self.store = store
        self.background: dict[str, asyncio.Task] = {}  # the background responses running

    async def create_response(
        self, request: ResponsesRequest, raw_request: Request
    ) -> ResponseObject | StreamingResponse:
        arrival_time = time.monotonic()
        model, _ = self.chat.check_model(request.model)
        _check_background(request)
        conversation = self._history(request) + conversation_of(request.input)
        chat_request = chat_request_of(request, conversation)
        try:
            run = await self.chat.prepare_chat(chat_request)
        except OpenAIError as e:
            raise _in_responses_terms(e) from e
        response = _echo(request, model)
        if request.background:
            return self._start(request, response, conversation, (chat_request, run, arrival_time))
        answer = await self.chat.answer(chat_request, run, raw_request, arrival_time, response.id)
        if isinstance(answer, ChatCompletionResponse):
            return self._complete(request, response, conversation, answer)
        events = self._events(request, response, conversation, answer)
        return StreamingResponse(_sse(events), media_type="text/event-stream")

    def get_response(
        self, response_id: str, stream: bool = False, starting_after: int | None = None
    ) -> ResponseObject | StreamingResponse:
        """The stored response; with `stream`, its events after `starting_after` and then
        the live ones (only a response created with background and stream has them)."""
        stored = self.store.get(response_id)
        if not stream:
            return stored.response
        if stored.events is None:
            raise OpenAIError(
                f"Response {response_id!r} cannot be streamed: only a response created with "
                "background=true and stream=true can be",
                param="stream",
            )
        events = stored.events.follow(starting_after)
        return StreamingResponse(_sse_lines(events), media_type="text/event-stream")

    def list_input_items(
        self, response_id: str, limit: int, order: Literal["asc", "desc"], after: str | None
    ) -> InputItemList:
        return page(self.store.get(response_id).input_items, limit, order, after)

    def delete_response(self, response_id: str) -> DeletedResponse:
        stored = self.store.get(response_id)
        self.store.delete(response_id)
        if stored.events is not None:
            stored.events.close()
        if (task := self.background.pop(response_id, None)) is not None:
            task.cancel()
        return DeletedResponse(id=response_id)

    def cancel_response(self, response_id: str) -> ResponseObject:
        stored = self.store.get(response_id)
        task = self.background.pop(response_id, None)
        if task is None or task.done():
            raise OpenAIError(
                "Only a background response still running can be cancelled; this one is "
                f"{stored.response.status}"
                + (
                    ""
                    if stored.response.background
                    else " and was not created with background=true"
                ),
            )
        task.cancel()
        response = self._update(stored, {"status": "cancelled"})
        if stored.events is not None:  # OpenAI's event set has no cancelled one: they end
            stored.events.close()
        return response

    def _start(
        self,
        request: ResponsesRequest,
        response: ResponseObject,
        conversation: list[ChatMessage],
        prepared: tuple[ChatCompletionRequest, ChatRun, float],
    ) -> ResponseObject | StreamingResponse:
        """Store the response `queued` and run it in a task; answer with it now, or with
        `stream` with its events."""
        response = response.model_copy(update={"status": "queued"})
        events = ResponseEvents() if request.stream else None
        stored = StoredResponse(response, conversation, input_items_of(request.input), events)
        self.store.put(stored)
        run = self._run_streamed if events is not None else self._run_background
        task = asyncio.create_task(run(request, stored, prepared))
        self.background[response.id] = task
        task.add_done_callback(lambda _: self._forget(response.id, task))
        if events is None:
            return response
        return StreamingResponse(_sse_lines(events.follow()), media_type="text/event-stream")

    async def _run_background(
        self,
        request: ResponsesRequest,
        stored: StoredResponse,
        prepared: tuple[ChatCompletionRequest, ChatRun, float],
    ) -> None:
        """Run a background response to its end; a failure ends it `failed`, a cancel
        (which sets `cancelled` itself) ends the task here."""
        response = self._update(stored, {"status": "in_progress"})
        try:
            answer = await self.chat.answer(*prepared[:2], None, prepared[2], response.id)
        except Exception as e:  # noqa: BLE001 - the failure belongs in the response
            error = ResponseError(message=engine_error(e).message)
            self._update(stored, {"status": "failed", "error": error})
            return
        assert isinstance(answer, ChatCompletionResponse)
        self._complete(request, response, stored.conversation, answer)

    async def _run_streamed(
        self,
        request: ResponsesRequest,
        stored: StoredResponse,
        prepared: tuple[ChatCompletionRequest, ChatRun, float],
    ) -> None:
        """Run a background streamed response to its end, keeping its events; a failure
        ends it `failed` (a `response.failed` event), a cancel ends the task here."""
        events = stored.events
        assert events is not None
        response = self._update(stored, {"status": "in_progress"})
        try:
            chunks = await self.chat.answer(*prepared[:2], None, prepared[2], response.id)
            assert not isinstance(chunks, ChatCompletionResponse)
            async for event in self._events(request, response, stored.conversation, chunks):
                events.append(event)
        except Exception as e:  # noqa: BLE001 - the failure belongs in the response
            error = ResponseError(message=engine_error(e).message)
            failed = self._update(stored, {"status": "failed", "error": error})
            events.append({"type": "response.failed", "response": _dump(failed)})
        finally:
            events.close()

    def _forget(self, response_id: str, task: asyncio.Task) -> None:
        if self.background.get(response_id) is task:
            del self.background[response_id]

    def _update(self, stored: StoredResponse, changes: dict) -> ResponseObject:
        """Store `stored` again with its response changed (if it is still held)."""
        response = stored.response.model_copy(update=changes)
        if self.store.peek(response.id) is not None:
            self.store.put(replace(stored, response=response))
        return response

    def _history(self, request: ResponsesRequest) -> list[ChatMessage]:
        if request.previous_response_id is None:
            return []
        stored = self.store.get(request.previous_response_id, "previous_response_id")
        if stored.response.status in ("queued", "in_progress"):
            raise OpenAIError(
                f"previous_response_id {request.previous_response_id!r} is still "
                f"{stored.response.status}: continue it once it has finished",
                param="previous_response_id",
            )
        return list(stored.conversation)

    async def _events(
        self,
        request: ResponsesRequest,
        response: ResponseObject,
        conversation: list[ChatMessage],
        chunks: AsyncIterator[ChatCompletionStreamResponse],
    ) -> AsyncIterator[Event]:
        yield {"type": "response.created", "response": _dump(response)}
        yield {"type": "response.in_progress", "response": _dump(response)}
        items, usage, finish_reason = OutputItems(), None, None
        async with aclosing(chunks):
            async for chunk in chunks:
                usage = chunk.usage or usage
                for choice in chunk.choices:
                    finish_reason = choice.finish_reason or finish_reason
                    for event in items.feed(choice.delta):
                        yield event
        status = _status(finish_reason)
        for event in items.finish(_item_status(status)):
            yield event
        response = self._finished(response, items.items, usage, status)
        self._store(request, response, conversation)
        yield {"type": f"response.{status}", "response": _dump(response)}

    def _complete(
        self,
        request: ResponsesRequest,
        response: ResponseObject,
        conversation: list[ChatMessage],
        answer: ChatCompletionResponse,
    ) -> ResponseObject:
        """The response made of a whole chat answer, stored if asked."""
        choice = answer.choices[0]
        status = _status(choice.finish_reason)
        items = output_items(choice.message, _item_status(status))
        response = self._finished(response, items, answer.usage, status)
        self._store(request, response, conversation)
        return response

    def _finished(
        self,
        response: ResponseObject,
        items: list[OutputItem],
        usage: UsageInfo | None,
        status: ResponseStatus,
    ) -> ResponseObject:
        reasoning = item_text(items, OutputReasoning)
        reasoning_tokens = len(self.chat.tokenizer.encode(reasoning, add_special_tokens=False))
        cut = status == "incomplete"
        incomplete = IncompleteDetails(reason="max_output_tokens") if cut else None
        return response.model_copy(
            update={
                "status": status,
                "output": items,
                "usage": _usage(usage, reasoning_tokens),
                "incomplete_details": incomplete,
            }
        )

    def _store(
        self, request: ResponsesRequest, response: ResponseObject, conversation: list[ChatMessage]
    ) -> None:
        if not request.store:
            return
        answer = assistant_message(response.output)
        stored = [*conversation, answer] if answer is not None else conversation
        held = self.store.peek(response.id)  # a background streamed one keeps its events
        events = held.events if held is not None else None
        self.store.put(StoredResponse(response, stored, input_items_of(request.input), events))


def _echo(request: ResponsesRequest, model: str) -> ResponseObject:
    """The response in progress, with what the request asked for."""
    return ResponseObject(
        model=model,
        instructions=request.instructions,
        tools=request.tools,
        tool_choice=request.tool_choice or "auto",
        parallel_tool_calls=request.parallel_tool_calls is not False,
        text=request.text,
        reasoning=request.reasoning,
        max_output_tokens=request.max_output_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        previous_response_id=request.previous_response_id,
        store=request.store,
        background=request.background,
        metadata=request.metadata or {},
        user=request.user,
    )


def _in_responses_terms(error: OpenAIError) -> OpenAIError:
    """Chat's error about the output limit or the conversation, naming the field this
    request sent."""
    if error.param == "messages":
        return OpenAIError(error.message, error.status_code, "input", error.code)
    if error.param not in ("max_tokens", "max_completion_tokens"):
        return error
    message = re.sub(r"\bmax_(?:completion_)?tokens\b", "max_output_tokens", error.message)
    return OpenAIError(message, error.status_code, "max_output_tokens", error.code)


def _check_background(request: ResponsesRequest) -> None:
    if request.background and not request.store:
        raise OpenAIError("background=true requires store=true", param="background")


def _status(finish_reason: str | None) -> ResponseStatus:
    return "incomplete" if finish_reason == "length" else "completed"


def _item_status(status: ResponseStatus) -> ItemStatus:
    return "incomplete" if status == "incomplete" else "completed"


def _usage(usage: UsageInfo | None, reasoning_tokens: int) -> ResponseUsage:
    usage = usage or UsageInfo()
    cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
    return ResponseUsage(
        input_tokens=usage.prompt_tokens,
        input_tokens_details=InputTokensDetails(cached_tokens=cached),
        output_tokens=usage.completion_tokens,
        output_tokens_details=OutputTokensDetails(reasoning_tokens=reasoning_tokens),
        total_tokens=usage.total_tokens,
    )


def _dump(response: ResponseObject) -> dict:
    return response.model_dump(mode="json", by_alias=True)


async def _sse(events: AsyncIterator[Event]) -> AsyncIterator[str]:
    """Each event as OpenAI sends it, `event: <type>` then `data: <json>`, numbered from
    0. An error once the 200 is out is an `error` event, and the stream ends."""
    sequence_number = 0
    async with aclosing(events):
        try:
            async for event in events:
                yield _sse_event(event | {"sequence_number": sequence_number})
                sequence_number += 1
        except Exception as e:  # noqa: BLE001 - the 200 is out: the error goes in the stream
            error = engine_error(e)
            event = {
                "type": "error",
                "code": error.code,
                "message": error.message,
                "param": error.param,
                "sequence_number": sequence_number,
            }
            yield _sse_event(event)


async def _sse_lines(events: AsyncIterator[Event]) -> AsyncIterator[str]:
    """Events already numbered (a background streamed response's), as `_sse` sends them."""
    async with aclosing(events):
        async for event in events:
            yield _sse_event(event)


def _sse_event(event: Event) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"
