"""Streams of engine outputs on the server: DELTA outputs accumulated into final ones,
several requests' streams merged, a client's disconnect noticed, and SSE framing."""

import asyncio
import copy
from collections.abc import AsyncIterator, Awaitable
from contextlib import aclosing
from typing import TypeVar

from fastapi import Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from pagedllm.entrypoints.openai.errors import OpenAIError, engine_error, error_body
from pagedllm.outputs import RequestOutput

T = TypeVar("T")


def accumulate(total: RequestOutput | None, delta: RequestOutput) -> RequestOutput:
    """`total` extended by a DELTA output (a new object; `total` is not changed)."""
    if total is None:
        return copy.copy(delta)
    total = copy.copy(total)
    total.add(delta)
    return total


async def merge_streams(
    streams: list[AsyncIterator[T]],
) -> AsyncIterator[tuple[int, T]]:
    """(stream index, item) from all streams as they come. Closing the merged iterator, or
    an error in one stream, cancels (and so closes) all the others."""
    if len(streams) == 1:
        async with aclosing(streams[0]):
            async for item in streams[0]:
                yield 0, item
        return
    items: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(index: int, stream: AsyncIterator[T]) -> None:
        try:
            async with aclosing(stream):
                async for item in stream:
                    items.put_nowait((index, item))
        except Exception as e:
            items.put_nowait(e)
        items.put_nowait(done)

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        for _ in tasks:
            while (item := await items.get()) is not done:
                if isinstance(item, Exception):
                    raise item
                yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def until_disconnected(awaitable: Awaitable[T], raw_request: Request | None) -> T:
    """Await `awaitable`, cancelling it if the client disconnects first (then 499); with
    no request (work no client waits on), just await it."""
    if raw_request is None:
        return await awaitable
    work = asyncio.ensure_future(awaitable)
    watcher = asyncio.ensure_future(_wait_for_disconnect(raw_request))
    try:
        await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not work.done():
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
    if work.cancelled():
        raise OpenAIError("the client disconnected", 499)
    return work.result()


async def _wait_for_disconnect(raw_request: Request) -> None:
    while (await raw_request.receive())["type"] != "http.disconnect":
        pass


async def prepend(first: T, rest: AsyncIterator[T]) -> AsyncIterator[T]:
    async with aclosing(rest):
        yield first
        async for item in rest:
            yield item


def sse_response(chunks: AsyncIterator[BaseModel]) -> StreamingResponse:
    """Server-sent events: each chunk as `data: {json}`, then `data: [DONE]`. An error
    once streaming has begun (the 200 status is out) is sent as an error event."""
    return StreamingResponse(_sse_events(chunks), media_type="text/event-stream")


async def _sse_events(chunks: AsyncIterator[BaseModel]) -> AsyncIterator[str]:
    async with aclosing(chunks):
        try:
            async for chunk in chunks:
                yield f"data: {chunk.model_dump_json()}\n\n"
        except Exception as e:  # noqa: BLE001 - the 200 is out: the error goes in the stream
            error = engine_error(e)
            body = error_body(error.message, error.status_code, error.param, error.code)
            yield f"data: {body.model_dump_json()}\n\n"
    yield "data: [DONE]\n\n"
