"""POST /v1/chat/completions: messages through the chat template (the tokenizer's, or the
server's --chat-template), n choices, streamed as SSE deltas or answered at once."""

import time
from collections.abc import AsyncIterator
from contextlib import aclosing

from fastapi import Request
from fastapi.responses import StreamingResponse

from pagedllm.entrypoints.openai.errors import OpenAIError
from pagedllm.entrypoints.openai.logprobs import chat_logprobs
from pagedllm.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    random_id,
)
from pagedllm.entrypoints.openai.responses import (
    AssistantMessage,
    ChatCompletionLogProbs,
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatCompletionResponseStreamChoice,
    ChatCompletionStreamResponse,
    DeltaMessage,
    UsageInfo,
)
from pagedllm.entrypoints.openai.serving_engine import OpenAIServing
from pagedllm.entrypoints.openai.streaming import merge_streams, sse_response, until_disconnected
from pagedllm.outputs import CompletionOutput, RequestOutput


class OpenAIServingChat(OpenAIServing):
    async def create_chat_completion(
        self, request: ChatCompletionRequest, raw_request: Request
    ) -> ChatCompletionResponse | StreamingResponse:
        arrival_time = time.monotonic()
        model = self.check_model(request.model)
        if request.top_logprobs is not None and not request.logprobs:
            raise OpenAIError("top_logprobs needs logprobs=true", param="top_logprobs")
        prompt_ids = await self.apply_chat_template(request.messages, request.add_generation_prompt)
        max_tokens = self.max_tokens(request.requested_max_tokens, len(prompt_ids), "messages")
        logprobs = (request.top_logprobs or 0) if request.logprobs else None
        params = self.sampling_params(request, max_tokens, logprobs)
        request_id = random_id("chatcmpl")
        stream = self.generate({"prompt_token_ids": prompt_ids}, params, request_id, arrival_time)
        outputs = merge_streams([stream])
        if request.stream:
            outputs = await self.prime(outputs, raw_request)
            return sse_response(self._chunks(request, request_id, model, outputs))
        (final,) = await until_disconnected(self.collect(outputs, 1), raw_request)
        return self._response(request, request_id, model, final)

    def _response(
        self, request: ChatCompletionRequest, request_id: str, model: str, final: RequestOutput
    ) -> ChatCompletionResponse:
        choices = [
            ChatCompletionResponseChoice(
                index=c.index,
                message=AssistantMessage(content=c.text),
                logprobs=self._logprobs(request, c),
                finish_reason=c.finish_reason,
                stop_reason=c.stop_reason,
            )
            for c in final.outputs
        ]
        num_generated = sum(len(c.token_ids) for c in final.outputs)
        usage = UsageInfo.of(len(final.prompt_token_ids), num_generated)
        return ChatCompletionResponse(id=request_id, model=model, choices=choices, usage=usage)

    async def _chunks(
        self,
        request: ChatCompletionRequest,
        request_id: str,
        model: str,
        outputs: AsyncIterator[tuple[int, RequestOutput]],
    ) -> AsyncIterator[ChatCompletionStreamResponse]:
        """Per choice a first delta with the role, then content deltas, the finish reason
        once; then the usage chunk if asked."""
        started, finished, prompt_tokens, num_generated = set(), set(), 0, 0
        async with aclosing(outputs):
            async for _, output in outputs:
                prompt_tokens = len(output.prompt_token_ids)
                for c in output.outputs:
                    num_generated += len(c.token_ids)
                    if not (c.token_ids or (c.finish_reason and c.index not in finished)):
                        continue
                    role = None if c.index in started else "assistant"
                    started.add(c.index)
                    if c.finish_reason is not None:
                        finished.add(c.index)
                    choice = self._stream_choice(request, c, role)
                    yield ChatCompletionStreamResponse(id=request_id, model=model, choices=[choice])
        if request.include_usage:
            usage = UsageInfo.of(prompt_tokens, num_generated)
            yield ChatCompletionStreamResponse(id=request_id, model=model, choices=[], usage=usage)

    def _stream_choice(
        self, request: ChatCompletionRequest, c: CompletionOutput, role: str | None
    ) -> ChatCompletionResponseStreamChoice:
        return ChatCompletionResponseStreamChoice(
            index=c.index,
            delta=DeltaMessage(role=role, content=c.text),
            logprobs=self._logprobs(request, c),
            finish_reason=c.finish_reason,
            stop_reason=c.stop_reason,
        )

    def _logprobs(
        self, request: ChatCompletionRequest, c: CompletionOutput
    ) -> ChatCompletionLogProbs | None:
        if not request.logprobs or c.logprobs is None:
            return None
        return chat_logprobs(self.tokenizer, c.token_ids, c.logprobs, request.top_logprobs or 0)
