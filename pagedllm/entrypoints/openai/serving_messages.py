"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API on the chat
machinery. A request becomes the chat request it means (anthropic_protocol.py), which
OpenAIServingChat checks and prepares (chat template with tools, the tool choice's
structured outputs, the parsers); the answer's parsed text, reasoning and tool calls
become Anthropic's content blocks, whole or streamed (anthropic_streaming.py). One answer
per request: the Messages API has no `n`.
"""

import dataclasses
import json
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse
from pydantic import ValidationError

from pagedllm.entrypoints.openai.anthropic_protocol import (
    AnthropicUsage,
    CountTokensRequest,
    CountTokensResponse,
    MessagesRequest,
    MessagesResponse,
    ResponseContent,
    StopReason,
    TextContent,
    ThinkingContent,
    ToolUseContent,
    anthropic_id,
)
from pagedllm.entrypoints.openai.anthropic_streaming import (
    ContentBlockEvents,
    Event,
    anthropic_sse,
)
from pagedllm.entrypoints.openai.chat_choice_parser import ChoiceDelta, ChoiceParser
from pagedllm.entrypoints.openai.errors import OpenAIError
from pagedllm.entrypoints.openai.protocol import ChatCompletionRequest
from pagedllm.entrypoints.openai.serving_chat import ChatRun, OpenAIServingChat
from pagedllm.entrypoints.openai.streaming import merge_streams, until_disconnected
from pagedllm.entrypoints.openai.tool_parsers import join_tool_call_deltas
from pagedllm.logger import init_logger
from pagedllm.outputs import CompletionOutput, RequestOutput

logger = init_logger(__name__)


class AnthropicServingMessages:
    def __init__(self, chat: OpenAIServingChat) -> None:
        self.chat = chat

    async def create_message(
        self, request: MessagesRequest, raw_request: Request
    ) -> MessagesResponse | StreamingResponse:
        arrival_time = time.monotonic()
        if request.model_extra:
            logger.warning("the request's fields %r are ignored", sorted(request.model_extra))
        run = await self.chat.prepare_chat(_chat_request(request))
        # Generation stops at the context window when it leaves less than max_tokens.
        context_limited = run.params.max_tokens < request.max_tokens
        run = _capped(run, request.max_tokens)
        message_id = anthropic_id("msg")
        stream = self.chat.generate(
            run.prompt, run.params, message_id, arrival_time, lora_request=run.lora_request
        )
        outputs = merge_streams([stream])
        if request.stream:
            outputs = await self.chat.prime(outputs, raw_request)
            return anthropic_sse(_events(message_id, run, outputs, context_limited))
        (final,) = await until_disconnected(self.chat.collect(outputs, 1), raw_request)
        return _message(message_id, run, final, context_limited)

    async def count_tokens(self, request: CountTokensRequest) -> CountTokensResponse:
        """The prompt's tokens as /v1/messages would generate from them."""
        chat_request = _chat_request(request)
        self.chat.check_model(chat_request.model)
        _, prompt_ids = await self.chat.apply_chat_template(chat_request)
        return CountTokensResponse(input_tokens=len(prompt_ids))


def _chat_request(request: CountTokensRequest) -> ChatCompletionRequest:
    try:
        return request.as_chat_request()
    except ValidationError as e:
        raise OpenAIError(f"the request has no chat equivalent: {e}", param="messages") from e


def _capped(run: ChatRun, max_tokens: int) -> ChatRun:
    """`run` with at most `max_tokens`; its own max_tokens is the context's room left."""
    params = dataclasses.replace(run.params, max_tokens=min(run.params.max_tokens, max_tokens))
    return dataclasses.replace(run, params=params)


def _message(
    message_id: str, run: ChatRun, final: RequestOutput, context_limited: bool
) -> MessagesResponse:
    (c,) = final.outputs
    parser = run.parsers() if run.parsers else None
    parsed = _parsed(parser, c)
    content: list[ResponseContent] = []
    if parsed.reasoning:
        content.append(ThinkingContent(thinking=parsed.reasoning))
    if parsed.content:
        content.append(TextContent(text=parsed.content))
    for call in join_tool_call_deltas(parsed.tool_calls):
        content.append(ToolUseContent(name=call.name, input=_tool_input(call.arguments)))
    stop_reason, stop_sequence = _stop_reason(c, parser, context_limited)
    usage = AnthropicUsage(input_tokens=len(final.prompt_token_ids), output_tokens=len(c.token_ids))
    return MessagesResponse(
        id=message_id,
        content=content,
        model=run.model,
        stop_reason=stop_reason,
        stop_sequence=stop_sequence,
        usage=usage,
    )


async def _events(
    message_id: str,
    run: ChatRun,
    outputs: AsyncIterator[tuple[int, RequestOutput]],
    context_limited: bool,
) -> AsyncIterator[Event]:
    """message_start, ping, the content blocks' events, message_delta (the stop reason
    and the output tokens), message_stop."""
    input_tokens = len(run.prompt_token_ids)
    start = MessagesResponse(
        id=message_id,
        content=[],
        model=run.model,
        stop_reason=None,
        usage=AnthropicUsage(input_tokens=input_tokens, output_tokens=0),
    )
    yield "message_start", {"type": "message_start", "message": start.model_dump()}
    yield "ping", {"type": "ping"}
    parser = run.parsers() if run.parsers else None
    blocks = ContentBlockEvents()
    output_tokens, last = 0, None
    async with aclosing(outputs):
        async for _, output in outputs:
            for c in output.outputs:
                output_tokens += len(c.token_ids)
                for event in blocks.feed(_parsed(parser, c)):
                    yield event
                last = c
    for event in blocks.stop():
        yield event
    stop_reason, stop_sequence = _stop_reason(last, parser, context_limited)
    delta = {"stop_reason": stop_reason, "stop_sequence": stop_sequence}
    usage = {"input_tokens": input_tokens, "output_tokens": output_tokens}
    yield "message_delta", {"type": "message_delta", "delta": delta, "usage": usage}
    yield "message_stop", {"type": "message_stop"}


def _parsed(parser: ChoiceParser | None, c: CompletionOutput) -> ChoiceDelta:
    """What `c` (the whole answer, or its latest piece) settles."""
    if parser is None:
        return ChoiceDelta(content=c.text)
    parsed = parser.feed(c.text)
    return parsed + parser.finish() if c.finish_reason is not None else parsed


def _stop_reason(
    c: CompletionOutput | None, parser: ChoiceParser | None, context_limited: bool
) -> tuple[StopReason, str | None]:
    """(stop_reason, stop_sequence): the matched stop string is the engine's stop_reason
    (a stop token id, the end of the turn, is an int). The length limit is the context
    window's when it left less room than the request's max_tokens."""
    if c is not None and c.finish_reason == "length":
        return ("model_context_window_exceeded" if context_limited else "max_tokens"), None
    if c is not None and isinstance(c.stop_reason, str):  # it may have cut a call short
        return "stop_sequence", c.stop_reason
    if parser is not None and parser.tools_called:
        return "tool_use", None
    return "end_turn", None


def _tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as Anthropic's `input` object. Arguments that are no JSON
    object (a call cut short by max_tokens) give {}: a tool_use block's input is always
    an object."""
    try:
        value = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}
