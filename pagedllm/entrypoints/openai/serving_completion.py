"""POST /v1/completions: one or many prompts (text or token ids), n choices each, streamed
as SSE or answered at once; choice i * n + k is prompt i's k-th sample (as in OpenAI)."""

import dataclasses
import functools
import time
from collections.abc import AsyncIterator
from contextlib import aclosing

from fastapi import Request
from fastapi.responses import StreamingResponse

from pagedllm.entrypoints.openai.errors import OpenAIError
from pagedllm.entrypoints.openai.logprobs import TextOffsets, TopLogprobs, completion_logprobs
from pagedllm.entrypoints.openai.protocol import CompletionRequest, TokenIds
from pagedllm.entrypoints.openai.responses import (
    CompletionResponse,
    CompletionResponseChoice,
    CompletionStreamResponse,
    UsageInfo,
)
from pagedllm.entrypoints.openai.serving_engine import OpenAIServing, engine_prompt
from pagedllm.entrypoints.openai.streaming import merge_streams, sse_response, until_disconnected
from pagedllm.entrypoints.openai.unsupported_fields import check_unsupported_fields
from pagedllm.outputs import CompletionOutput, RequestOutput, join_prompt_logprobs

Prompt = tuple[str, TokenIds]  # (text, token ids)


class OpenAIServingCompletion(OpenAIServing):
    async def create_completion(
        self, request: CompletionRequest, raw_request: Request
    ) -> CompletionResponse | StreamingResponse:
        arrival_time = time.monotonic()
        self.forced_usage(request)
        model, lora_request = self.check_model(request.model)
        self.check_generates()
        check_unsupported_fields(request.model_extra, "completion")
        self.check_priority(request.priority)
        prompts = await self._prompts(request.prompt, request.truncate_prompt_tokens)
        echo_logprobs = request.logprobs if request.echo else None
        prompt_only = request.echo and request.max_tokens == 0
        max_tokens = 1 if prompt_only else request.max_tokens
        params = [
            self.sampling_params(
                request,
                self.max_tokens(max_tokens, len(ids), "prompt"),
                request.logprobs,
                prompt_logprobs=echo_logprobs,
            )
            for _, ids in prompts
        ]
        params = [self.beam_search_request(request, p) or p for p in params]
        request_id = self.request_id("cmpl", raw_request, request.request_id)
        streams = [
            self.generate(
                engine_prompt(text, ids, request.cache_salt),
                p,
                f"{request_id}-{i}",
                arrival_time,
                request.priority,
                lora_request,
            )
            for i, ((text, ids), p) in enumerate(zip(prompts, params))
        ]
        outputs = merge_streams(streams)
        if prompt_only:
            outputs = _without_generation(outputs)
        if request.stream:
            outputs = await self.prime(outputs, raw_request)
            return sse_response(self._chunks(request, request_id, model, prompts, outputs))
        finals = await until_disconnected(self.collect(outputs, len(prompts)), raw_request)
        return self._response(request, request_id, model, prompts, finals)

    async def _prompts(self, prompt: str | list, keep: int | None) -> list[Prompt]:
        """Each prompt's text and token ids, cut to the last `keep` (truncate_prompt_tokens;
        a cut text prompt's text is then its kept tokens')."""
        if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
            prompt = [prompt]
        if not prompt:
            raise OpenAIError("prompt must not be an empty list", param="prompt")
        prompts = []
        for p in prompt:
            if isinstance(p, str):
                ids = await self.encode(p)
                kept = self.truncated(ids, keep)
                text = p if kept == ids else await self.async_tokenizer.decode(kept)
                prompts.append((text, kept))
            else:
                ids = self.truncated(self.check_token_ids(p, "prompt"), keep)
                prompts.append((await self.async_tokenizer.decode(ids), ids))
        return prompts

    # Answers.

    def choice(
        self,
        request: CompletionRequest,
        index: int,
        prompt: Prompt,
        prompt_logprobs: TopLogprobs | None,
        c: CompletionOutput,
        first: bool,
        offsets: TextOffsets | None = None,
    ) -> CompletionResponseChoice:
        """Choice `c` of `prompt` as choice number `index`; `first`: `c` is the choice's
        first piece (a whole answer is), which carries the echo and the prompt's token ids;
        `offsets`: where its tokens' text starts (a stream keeps one per choice)."""
        echo = first and request.echo
        text, token_ids, tops = c.text, c.token_ids, c.logprobs
        if echo:
            text, token_ids = prompt[0] + text, prompt[1] + token_ids
            if tops is not None:
                tops = (prompt_logprobs or [None] * len(prompt[1])) + tops
        logprobs = None
        if request.logprobs is not None:
            tops = tops or [None] * len(token_ids)
            positions = self._offsets(request, [], 0).of(prompt[1]) if echo else []
            positions += (offsets or self.text_offsets(request, prompt)).of(c.token_ids)
            as_ids = self.as_token_ids(request)
            logprobs = completion_logprobs(self.tokenizer, token_ids, tops, positions, as_ids)
        asked = request.return_token_ids
        return CompletionResponseChoice(
            index=index,
            text=text,
            logprobs=logprobs,
            finish_reason=c.finish_reason,
            stop_reason=c.stop_reason,
            prompt_token_ids=prompt[1] if asked and first else None,
            token_ids=c.token_ids if asked else None,
        )

    def text_offsets(self, request: CompletionRequest, prompt: Prompt) -> TextOffsets:
        """Where a choice's generated tokens start in its text: after the prompt's text when
        it is echoed, from 0 otherwise."""
        start = len(prompt[0]) if request.echo else 0
        return self._offsets(request, prompt[1], start)

    def _offsets(self, request: CompletionRequest, context: list[int], start: int) -> TextOffsets:
        return TextOffsets(
            self.tokenizer,
            context,
            start,
            request.skip_special_tokens,
            request.spaces_between_special_tokens,
        )

    def _response(
        self,
        request: CompletionRequest,
        request_id: str,
        model: str,
        prompts: list[Prompt],
        finals: list[RequestOutput],
    ) -> CompletionResponse:
        choices = []
        for i, (prompt, output) in enumerate(zip(prompts, finals)):
            for c in output.outputs:
                index = i * request.n + c.index
                choices.append(self.choice(request, index, prompt, output.prompt_logprobs, c, True))
        completion_tokens = sum(len(c.token_ids) for o in finals for c in o.outputs)
        cached_tokens = sum(o.num_cached_tokens for o in finals)
        usage = _usage(prompts, completion_tokens, cached_tokens)
        return CompletionResponse(id=request_id, model=model, choices=choices, usage=usage)

    async def _chunks(
        self,
        request: CompletionRequest,
        request_id: str,
        model: str,
        prompts: list[Prompt],
        outputs: AsyncIterator[tuple[int, RequestOutput]],
    ) -> AsyncIterator[CompletionStreamResponse]:
        """Each choice's new text (the prompt first if echo) and its finish reason once,
        then the usage chunk if asked (and with continuous usage, each chunk's choice's
        usage so far). Every chunk has the same `created`."""
        state = _StreamState(self, request, prompts)
        chunk = functools.partial(
            CompletionStreamResponse, id=request_id, model=model, created=int(time.time())
        )
        async with aclosing(outputs):
            async for i, output in outputs:
                for choice in state.choices(i, output):
                    usage = state.usage(i, choice.index) if request.continuous_usage else None
                    yield chunk(choices=[choice], usage=usage)
        if request.include_usage:
            usage = _usage(prompts, state.completion_tokens, sum(state.cached_tokens.values()))
            yield chunk(choices=[], usage=usage)


class _StreamState:
    """What a completions stream has sent: per choice its tokens' text offsets (present
    once its first chunk, with the echo and the prompt's token ids, went out) and whether
    its finish reason went out."""

    def __init__(
        self, serving: OpenAIServingCompletion, request: CompletionRequest, prompts: list
    ) -> None:
        self.serving, self.request, self.prompts = serving, request, prompts
        self.prompt_logprobs: dict[int, TopLogprobs | None] = {}
        self.offsets: dict[int, TextOffsets] = {}  # per choice, once its first chunk went out
        self.finished: set[int] = set()
        self.completion_tokens = 0
        self.generated: dict[int, int] = {}  # per choice
        self.cached_tokens: dict[int, int] = {}  # per prompt

    def usage(self, prompt_index: int, index: int) -> UsageInfo:
        """Choice `index`'s usage so far: its prompt's tokens and its own."""
        prompt_tokens = len(self.prompts[prompt_index][1])
        cached = self.cached_tokens.get(prompt_index, 0)
        return UsageInfo.of(prompt_tokens, self.generated.get(index, 0), cached)

    def choices(self, prompt_index: int, output: RequestOutput) -> list[CompletionResponseChoice]:
        """What to send of one DELTA output: the choices with new tokens or a finish.
        (Prompt logprobs come in pieces before the first token, one per prefill chunk, so
        they are gathered until the echo goes out.)"""
        self.prompt_logprobs[prompt_index] = join_prompt_logprobs(
            self.prompt_logprobs.get(prompt_index), output.prompt_logprobs
        )
        self.cached_tokens[prompt_index] = output.num_cached_tokens
        choices = []
        for c in output.outputs:
            index = prompt_index * self.request.n + c.index
            self.completion_tokens += len(c.token_ids)
            self.generated[index] = self.generated.get(index, 0) + len(c.token_ids)
            if not (c.token_ids or (c.finish_reason and index not in self.finished)):
                continue
            choices.append(self._choice(prompt_index, index, c))
            if c.finish_reason is not None:
                self.finished.add(index)
        return choices

    def _choice(
        self, prompt_index: int, index: int, c: CompletionOutput
    ) -> CompletionResponseChoice:
        first = index not in self.offsets
        prompt_logprobs = self.prompt_logprobs.get(prompt_index)
        prompt = self.prompts[prompt_index]
        if first:
            self.offsets[index] = self.serving.text_offsets(self.request, prompt)
        offsets = self.offsets[index]
        return self.serving.choice(self.request, index, prompt, prompt_logprobs, c, first, offsets)


async def _without_generation(
    outputs: AsyncIterator[tuple[int, RequestOutput]],
) -> AsyncIterator[tuple[int, RequestOutput]]:
    """vLLM's echo without generation (echo with max_tokens 0, how clients score a prompt):
    the engine runs one token, which no choice shows; each choice is its prompt (and with
    `logprobs` the prompt's logprobs), 0 completion tokens, finished by "length"."""
    async with aclosing(outputs):
        async for i, output in outputs:
            yield i, dataclasses.replace(output, outputs=[_emptied(c) for c in output.outputs])


def _emptied(c: CompletionOutput) -> CompletionOutput:
    """`c` with no tokens; a failed or aborted one keeps its finish reason."""
    finish_reason = c.finish_reason
    if finish_reason in ("stop", "length"):
        finish_reason = "length"
    logprobs = None if c.logprobs is None else []
    return CompletionOutput(c.index, "", [], None, logprobs, finish_reason)


def _usage(prompts: list[Prompt], completion_tokens: int, cached_tokens: int) -> UsageInfo:
    return UsageInfo.of(sum(len(ids) for _, ids in prompts), completion_tokens, cached_tokens)
