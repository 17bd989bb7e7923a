"""OpenAIServing: what every endpoint shares: the model name check, tokenization and the
context-length rule, SamplingParams from a request, and running requests on the AsyncLLM
(aborting them when the client goes away).

The server tokenizes with its own AsyncTokenizer (off the event loop, so a huge prompt
stalls no other client); the engine thread's tokenizer stays the engine's alone.
"""

import asyncio
import copy
from collections.abc import AsyncIterator, Awaitable, Sequence
from contextlib import aclosing
from http import HTTPStatus
from typing import TypeVar

from fastapi import Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from pagedllm.engine.input_processor import check_token_ids
from pagedllm.engine.protocol import EngineClient
from pagedllm.entrypoints.openai.async_tokenizer import AsyncTokenizer
from pagedllm.entrypoints.openai.errors import (
    OpenAIError,
    engine_error,
    error_body,
    invalid_value_error,
)
from pagedllm.entrypoints.openai.metrics import ServerMetrics
from pagedllm.entrypoints.openai.protocol import ChatMessage, SamplingFields
from pagedllm.outputs import CompletionOutput, PromptLogprobs, RequestOutput
from pagedllm.sampling_params import SamplingParams

T = TypeVar("T")

# JSON has no -inf; OpenAI's clients expect a number (vLLM's choice of floor).
MIN_LOGPROB = -9999.0


class OpenAIServing:
    def __init__(
        self,
        engine: EngineClient,
        tokenizer: AsyncTokenizer,
        served_model_names: list[str],
        metrics: ServerMetrics,
        chat_template: str | None = None,
    ) -> None:
        """`tokenizer` is the server's own (see the module docstring)."""
        self.engine = engine
        self.async_tokenizer = tokenizer
        self.tokenizer = tokenizer.sync
        self.served_model_names = served_model_names
        self.metrics = metrics
        self.chat_template = chat_template
        config = engine.config
        self.max_model_len = config.model_config.max_model_len
        self.vocab_size = config.model_config.vocab_size

    def check_model(self, model: str | None) -> str:
        """The model name to answer with; 404 for a name this server does not serve."""
        if model is None:
            return self.served_model_names[0]
        if model not in self.served_model_names:
            raise OpenAIError(
                f"The model `{model}` does not exist; this server serves {self.served_model_names}",
                HTTPStatus.NOT_FOUND,
                param="model",
                code="model_not_found",
            )
        return model

    # Prompts.

    async def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return await self.async_tokenizer.encode(text, add_special_tokens)

    def check_token_ids(self, token_ids: Sequence[int], param: str) -> list[int]:
        """The engine's own check, for token ids the server decodes before the engine
        sees them (an id past the vocabulary would make the tokenizer fail)."""
        try:
            check_token_ids(token_ids, self.vocab_size, param)
        except ValueError as e:
            raise OpenAIError(str(e), param=param) from e
        return list(token_ids)

    async def apply_chat_template(
        self, messages: list[ChatMessage], add_generation_prompt: bool = True
    ) -> list[int]:
        """Any failure of the template (it may raise on roles or orders it does not
        support) is the messages' fault: a 400."""
        conversation = [m.as_template_message() for m in messages]
        try:
            return await self.async_tokenizer.apply_chat_template(
                conversation, self.chat_template, add_generation_prompt
            )
        except Exception as e:  # noqa: BLE001 - templates raise anything
            raise OpenAIError(f"cannot apply the chat template: {e}", param="messages") from e

    def max_tokens(self, requested: int | None, prompt_len: int, param: str) -> int:
        """vLLM's context rule: prompt + max_tokens must fit in max_model_len; no max_tokens
        means all the room left. A max_tokens < 1 is left for SamplingParams to reject."""
        limit = self.max_model_len
        if prompt_len == 0:
            raise OpenAIError(f"the {param} is empty (0 tokens); give at least 1", param=param)
        if prompt_len >= limit:
            raise OpenAIError(
                f"This model's maximum context length is {limit} tokens, but the {param} has "
                f"{prompt_len} tokens, leaving no room for a completion.",
                param=param,
                code="context_length_exceeded",
            )
        if requested is None:
            return limit - prompt_len
        if requested >= 1 and prompt_len + requested > limit:
            raise OpenAIError(
                f"This model's maximum context length is {limit} tokens. However, you "
                f"requested {prompt_len + requested} tokens ({prompt_len} in the {param}, "
                f"{requested} in the completion). Reduce the {param} or max_tokens.",
                param="max_tokens",
                code="context_length_exceeded",
            )
        return requested

    def sampling_params(
        self,
        request: SamplingFields,
        max_tokens: int,
        logprobs: int | None,
        prompt_logprobs: int | None = None,
    ) -> SamplingParams:
        """DELTA outputs always: the server accumulates them itself for non-streamed
        answers, so the metrics see each token's time. The checks that need the model
        (`verify`) are the engine's, made when the request is added, before any output."""
        try:
            params = request.sampling_params(max_tokens, logprobs, prompt_logprobs)
        except (ValueError, TypeError) as e:
            raise invalid_value_error(e, type(request).model_fields) from e
        return params

    # Running requests.

    def generate(
        self, prompt: dict, params: SamplingParams, request_id: str, arrival_time: float
    ) -> AsyncIterator[RequestOutput]:
        return self.metrics.track(self.engine.generate(prompt, params, request_id), arrival_time)

    async def prime(self, outputs: AsyncIterator[T], raw_request: Request) -> AsyncIterator[T]:
        """`outputs` again, after waiting for its first item: a request the engine rejects
        still gets a 4xx, not a 200 stream. Closes `outputs` on failure or disconnect."""
        try:
            first = await until_disconnected(anext(outputs), raw_request)
        except Exception as e:
            await outputs.aclose()
            raise engine_error(e) from e
        except BaseException:
            await outputs.aclose()
            raise
        return _prepend(first, outputs)

    async def collect(
        self, outputs: AsyncIterator[tuple[int, RequestOutput]], num_prompts: int
    ) -> list[RequestOutput]:
        """Accumulate DELTA outputs into one final RequestOutput per prompt."""
        totals: list[RequestOutput | None] = [None] * num_prompts
        async with aclosing(outputs):
            try:
                async for i, delta in outputs:
                    totals[i] = accumulate(totals[i], delta)
            except Exception as e:
                raise engine_error(e) from e
        return totals


def accumulate(total: RequestOutput | None, delta: RequestOutput) -> RequestOutput:
    """`total` extended by a DELTA output (a new object; `total` is not changed)."""
    if total is None:
        return copy.copy(delta)
    by_index = {c.index: c for c in total.outputs}
    for c in delta.outputs:
        by_index[c.index] = _extend(by_index.get(c.index), c)
    total = copy.copy(total)
    total.outputs = [by_index[i] for i in sorted(by_index)]
    total.finished = delta.finished
    total.prompt_logprobs = join_prompt_logprobs(total.prompt_logprobs, delta.prompt_logprobs)
    return total


def join_prompt_logprobs(
    total: PromptLogprobs | None, delta: PromptLogprobs | None
) -> PromptLogprobs | None:
    """DELTA outputs carry prompt logprobs piece by piece (one per prefill chunk)."""
    if delta is None:
        return total
    return (total or []) + delta


def _extend(total: CompletionOutput | None, delta: CompletionOutput) -> CompletionOutput:
    if total is None:
        return copy.copy(delta)
    logprobs = None
    if total.logprobs is not None or delta.logprobs is not None:
        logprobs = (total.logprobs or []) + (delta.logprobs or [])
    return CompletionOutput(
        index=total.index,
        text=total.text + delta.text,
        token_ids=total.token_ids + delta.token_ids,
        cumulative_logprob=delta.cumulative_logprob,
        logprobs=logprobs,
        finish_reason=delta.finish_reason,
        stop_reason=delta.stop_reason,
    )


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


async def until_disconnected(awaitable: Awaitable[T], raw_request: Request) -> T:
    """Await `awaitable`, cancelling it if the client disconnects first (then 499)."""
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


async def _prepend(first: T, rest: AsyncIterator[T]) -> AsyncIterator[T]:
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


def clamp_logprob(logprob: float) -> float:
    return max(logprob, MIN_LOGPROB)
