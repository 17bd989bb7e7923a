"""POST /v1/chat/completions: messages (and tools) through the chat template (the
tokenizer's, or the server's --chat-template), n choices, streamed as SSE deltas or answered
at once. Each choice's text goes through the server's reasoning parser and the request's
tool parser (chat_choice_parser.py); a forced tool choice constrains the answer with
structured outputs (tool_choice.py), and so does "auto" in the generic tool format
(generic_tools.py), which also describes the tools in the system message; with a reasoning
parser the constraint starts after the reasoning part."""

import dataclasses
import functools
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from pagedllm.entrypoints.openai.chat_choice_parser import (
    ChoiceDelta,
    ChoiceParser,
    choice_parser_factory,
)
from pagedllm.entrypoints.openai.errors import OpenAIError
from pagedllm.entrypoints.openai.generic_tools import called_since_user, generic_tools_constraint
from pagedllm.entrypoints.openai.logprobs import chat_logprobs
from pagedllm.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    random_id,
)
from pagedllm.entrypoints.openai.reasoning import ReasoningParser
from pagedllm.entrypoints.openai.responses import (
    AssistantMessage,
    ChatCompletionLogProbs,
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatCompletionResponseStreamChoice,
    ChatCompletionStreamResponse,
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    FunctionCall,
    ToolCall,
    UsageInfo,
)
from pagedllm.entrypoints.openai.serving_beam_search import BeamSearchRequest
from pagedllm.entrypoints.openai.serving_engine import OpenAIServing, engine_prompt
from pagedllm.entrypoints.openai.streaming import merge_streams, sse_response, until_disconnected
from pagedllm.entrypoints.openai.tool_choice import (
    check_tools_grammar,
    tool_choice_of,
    tool_choice_schema,
    tool_parser_factory,
)
from pagedllm.entrypoints.openai.tool_parsers import (
    ToolCallDelta,
    join_tool_call_deltas,
)
from pagedllm.entrypoints.openai.tool_results import check_tool_results
from pagedllm.entrypoints.openai.unsupported_fields import check_unsupported_fields
from pagedllm.lora.request import LoRARequest
from pagedllm.outputs import CompletionOutput, RequestOutput
from pagedllm.sampling_params import SamplingParams, StructuredOutputsParams

Parsers = Callable[[], ChoiceParser] | None  # a new parser per choice, or None: plain content


@dataclasses.dataclass(frozen=True)
class ChatRun:
    """A checked chat request, ready to generate."""

    model: str  # the served name to answer with
    prompt_token_ids: list[int]
    params: SamplingParams
    parsers: Parsers
    prompt_text: str | None = None  # the templated text (request logs, outputs' `prompt`)
    beam_search: BeamSearchRequest | None = None  # use_beam_search's, run instead of `params`
    cache_salt: str | None = None
    priority: int = 0
    lora_request: LoRARequest | None = None  # the adapter `model` names, if it names one

    @property
    def prompt(self) -> dict:
        return engine_prompt(self.prompt_text, self.prompt_token_ids, self.cache_salt)


class OpenAIServingChat(OpenAIServing):
    def __init__(
        self, *args: Any, reasoning_parser: type[ReasoningParser] | None = None, **kwargs: Any
    ) -> None:
        """`args`, `kwargs`: OpenAIServing's; `reasoning_parser`: the server's
        --reasoning-parser."""
        super().__init__(*args, **kwargs)
        self.reasoning_parser = reasoning_parser
        self.response_role = "assistant"  # --response-role

    async def prepare_chat(self, request: ChatCompletionRequest) -> ChatRun:
        """The request's prompt, sampling parameters and parsers, checked (a 400 or 404
        for what is wrong), ready to generate; shared with /v1/messages."""
        model, lora_request = self.check_model(request.model)
        self.check_generates()
        check_unsupported_fields(request.model_extra, "chat")
        self.check_priority(request.priority)
        check_tool_results(request.messages)
        if request.top_logprobs is not None and not request.logprobs:
            raise OpenAIError("top_logprobs needs logprobs=true", param="top_logprobs")
        if request.logprobs and request.top_logprobs:
            cap = self.engine.config.max_logprobs
            if cap != -1 and request.top_logprobs > cap:
                raise OpenAIError(
                    f"top_logprobs must be <= {cap} (the server's --max-logprobs), got "
                    f"{request.top_logprobs}",
                    param="top_logprobs",
                )
        tool_choice = tool_choice_of(request)
        tool_parser = tool_parser_factory(tool_choice, self.tool_parser, request.tools)
        generic = self.uses_generic_format(request)
        prompt_text, prompt_ids = await self.apply_chat_template(request)
        prompt_ids = self.truncated(prompt_ids, request.truncate_prompt_tokens)
        limit = "max_tokens" if request.max_completion_tokens is None else "max_completion_tokens"
        max_tokens = self.max_tokens(
            request.requested_max_tokens, len(prompt_ids), "messages", limit
        )
        logprobs = (request.top_logprobs or 0) if request.logprobs else None
        params = self.sampling_params(request, max_tokens, logprobs)
        parallel = request.parallel_tool_calls is not False
        schema = tool_choice_schema(request.tools or [], tool_choice, parallel)
        if schema is not None:
            params = _forced_call(params, schema)
        elif generic and params.structured_outputs is None:
            one_call = request.parallel_tool_calls is not True  # llama.cpp's default
            called = called_since_user(request.messages)
            constraint = generic_tools_constraint(request.tools, not one_call, called)
            params = dataclasses.replace(params, structured_outputs=constraint)
        prefill = None
        if request.continue_final_message:
            prefill = request.messages[-1].as_template_message()["content"]
        if params.structured_outputs is not None and self.reasoning_parser is not None:
            # The constraint applies to the content after the reasoning part, as in vLLM.
            reasoning = self.reasoning_parser.reasoning_tokens(prompt_text, self.tokenizer, prefill)
            params = dataclasses.replace(params, reasoning_tokens=reasoning)
        parsers = choice_parser_factory(
            self.reasoning_parser, tool_parser, prompt_text, parallel, prefill
        )
        beam_search = self.beam_search_request(request, params)
        return ChatRun(
            model,
            prompt_ids,
            params,
            parsers,
            prompt_text,
            beam_search,
            request.cache_salt,
            request.priority,
            lora_request,
        )

    async def create_chat_completion(
        self, request: ChatCompletionRequest, raw_request: Request
    ) -> ChatCompletionResponse | StreamingResponse:
        self.forced_usage(request)
        answer = await self.chat(request, raw_request)
        return sse_response(answer) if request.stream else answer

    async def chat(
        self, request: ChatCompletionRequest, raw_request: Request
    ) -> ChatCompletionResponse | AsyncIterator[ChatCompletionStreamResponse]:
        """The whole answer, or with `stream` its chunks (the engine has accepted the
        request by then); other endpoints (serving_responses.py) reshape either."""
        arrival_time = time.monotonic()
        run = await self.prepare_chat(request)
        return await self.answer(request, run, raw_request, arrival_time)

    async def answer(
        self,
        request: ChatCompletionRequest,
        run: ChatRun,
        raw_request: Request | None,
        arrival_time: float,
        request_id: str | None = None,
    ) -> ChatCompletionResponse | AsyncIterator[ChatCompletionStreamResponse]:
        """`chat` once prepared; with no `raw_request` (a background response) no client's
        disconnection cancels it. `request_id`: the id the client sees, when it is not a
        chat completion's (a response's `resp_...`)."""
        model, parsers = run.model, run.parsers
        request_id = request_id or self.request_id("chatcmpl", raw_request, request.request_id)
        params = run.beam_search or run.params
        stream = self.generate(
            run.prompt, params, request_id, arrival_time, run.priority, run.lora_request
        )
        outputs = merge_streams([stream])
        if request.stream:
            outputs = await self.prime(outputs, raw_request)
            return self._chunks(request, request_id, model, outputs, parsers)
        (final,) = await until_disconnected(self.collect(outputs, 1), raw_request)
        return self._response(request, request_id, model, final, parsers)

    def _response(
        self,
        request: ChatCompletionRequest,
        request_id: str,
        model: str,
        final: RequestOutput,
        parsers: Parsers,
    ) -> ChatCompletionResponse:
        choices = []
        for c in final.outputs:
            message, finish_reason = self._message(request, c, parsers)
            choice = ChatCompletionResponseChoice(
                index=c.index,
                message=message,
                logprobs=self._logprobs(request, c),
                finish_reason=finish_reason,
                stop_reason=c.stop_reason,
                token_ids=c.token_ids if request.return_token_ids else None,
            )
            choices.append(choice)
        num_generated = sum(len(c.token_ids) for c in final.outputs)
        usage = UsageInfo.of(len(final.prompt_token_ids), num_generated, final.num_cached_tokens)
        return ChatCompletionResponse(
            id=request_id,
            model=model,
            choices=choices,
            usage=usage,
            prompt_token_ids=final.prompt_token_ids if request.return_token_ids else None,
        )

    def _message(
        self, request: ChatCompletionRequest, c: CompletionOutput, parsers: Parsers
    ) -> tuple[AssistantMessage, str | None]:
        """A whole choice's message and finish reason."""
        role = self.role(request)
        if parsers is None:
            return AssistantMessage(role=role, content=c.text), c.finish_reason
        parser = parsers()
        parsed = parser.parse(c.text)
        calls = [
            ToolCall(function=FunctionCall(name=call.name, arguments=call.arguments))
            for call in join_tool_call_deltas(parsed.tool_calls)
        ]
        message = AssistantMessage(
            role=role,
            content=parsed.content or None,
            reasoning_content=_reasoning(request, parsed),
            tool_calls=calls or None,
        )
        return message, _finish_reason(request, c, parser)

    async def _chunks(
        self,
        request: ChatCompletionRequest,
        request_id: str,
        model: str,
        outputs: AsyncIterator[tuple[int, RequestOutput]],
        parsers: Parsers,
    ) -> AsyncIterator[ChatCompletionStreamResponse]:
        """Per choice a first delta with the role, then content (reasoning, tool call)
        deltas, the finish reason once; then the usage chunk if asked (and with
        continuous usage, each chunk's choice's usage so far). A parser may hold text back:
        a chunk with nothing to say yet is not sent, unless it carries token ids
        (`return_token_ids`: the prompt's in the first chunk, each chunk's new ones in its
        choice). Every chunk has the same `created`."""
        started, finished, prompt_tokens, cached = set(), set(), 0, 0
        sent_prompt_ids = False
        generated: dict[int, int] = {}  # tokens per choice so far
        choice_parsers: dict[int, ChoiceParser] = {}
        chunk = functools.partial(
            ChatCompletionStreamResponse, id=request_id, model=model, created=int(time.time())
        )
        async with aclosing(outputs):
            async for _, output in outputs:
                prompt_tokens = len(output.prompt_token_ids)
                cached = output.num_cached_tokens
                for c in output.outputs:
                    generated[c.index] = generated.get(c.index, 0) + len(c.token_ids)
                    if not (c.token_ids or (c.finish_reason and c.index not in finished)):
                        continue
                    if c.finish_reason is not None:
                        finished.add(c.index)
                    if parsers is not None and c.index not in choice_parsers:
                        choice_parsers[c.index] = parsers()
                    parser = choice_parsers.get(c.index)
                    choice = self._stream_choice(request, c, parser, c.index not in started)
                    if choice is None:
                        continue
                    started.add(c.index)
                    usage = None
                    if request.continuous_usage:
                        usage = UsageInfo.of(prompt_tokens, generated[c.index], cached)
                    prompt_ids = None
                    if request.return_token_ids and not sent_prompt_ids:
                        prompt_ids, sent_prompt_ids = output.prompt_token_ids, True
                    yield chunk(choices=[choice], usage=usage, prompt_token_ids=prompt_ids)
        if request.include_usage:
            usage = UsageInfo.of(prompt_tokens, sum(generated.values()), cached)
            yield chunk(choices=[], usage=usage)

    def _stream_choice(
        self,
        request: ChatCompletionRequest,
        c: CompletionOutput,
        parser: ChoiceParser | None,
        first: bool,
    ) -> ChatCompletionResponseStreamChoice | None:
        """The chunk of a choice's new output, or None if a parser holds it all back."""
        logprobs = self._logprobs(request, c)
        finish_reason = c.finish_reason
        if parser is None:
            delta = DeltaMessage(content=c.text)
        else:
            parsed = parser.feed(c.text)
            if c.finish_reason is not None:
                parsed = parsed + parser.finish()
                finish_reason = _finish_reason(request, c, parser)
            delta = DeltaMessage(
                content=parsed.content or None,
                reasoning_content=_reasoning(request, parsed),
                tool_calls=[_delta_tool_call(d) for d in parsed.tool_calls] or None,
            )
            said = delta.content or delta.reasoning_content or delta.tool_calls
            # Held-back text still sends its token ids: joined, they are all generated.
            ids = request.return_token_ids and c.token_ids
            if not (said or logprobs or finish_reason or ids):
                return None
        delta.role = self.role(request) if first else None
        return ChatCompletionResponseStreamChoice(
            index=c.index,
            delta=delta,
            logprobs=logprobs,
            finish_reason=finish_reason,
            stop_reason=c.stop_reason,
            token_ids=c.token_ids if request.return_token_ids else None,
        )

    def role(self, request: ChatCompletionRequest) -> str:
        """vLLM's role of the answer: --response-role where the template adds a generation
        prompt, else the last message's (the answer continues it)."""
        return self.response_role if request.add_generation_prompt else request.messages[-1].role

    def _logprobs(
        self, request: ChatCompletionRequest, c: CompletionOutput
    ) -> ChatCompletionLogProbs | None:
        if not request.logprobs or c.logprobs is None:
            return None
        num_top, as_ids = request.top_logprobs or 0, self.as_token_ids(request)
        return chat_logprobs(self.tokenizer, c.token_ids, c.logprobs, num_top, as_ids)


def _forced_call(params: SamplingParams, schema: dict) -> SamplingParams:
    """`params` whose answer must follow `schema` (a forced tool choice's)."""
    if params.structured_outputs is not None:
        raise OpenAIError(
            'tool_choice "required" or a named function constrains the answer itself; it '
            "cannot be combined with response_format or structured_outputs",
            param="tool_choice",
        )
    try:
        constraint = StructuredOutputsParams(json=schema)
    except (ValueError, TypeError) as e:
        raise OpenAIError(f"tools cannot force a call: {e}", param="tools") from e
    constraint = check_tools_grammar(constraint)
    return dataclasses.replace(params, structured_outputs=constraint)


def _reasoning(request: ChatCompletionRequest, parsed: ChoiceDelta) -> str | None:
    return (parsed.reasoning or None) if request.include_reasoning else None


def _finish_reason(
    request: ChatCompletionRequest, c: CompletionOutput, parser: ChoiceParser
) -> str | None:
    """The finish reason is "tool_calls" for an answer that stopped after making calls,
    named tool choice included (OpenAI's API says "stop" there; agent loops that look for
    "tool_calls" see it for every kind of choice). A stop string ends it "stop": it may
    have cut the last call short, as max_tokens does with "length"."""
    if parser.tools_called and c.finish_reason == "stop" and not isinstance(c.stop_reason, str):
        return "tool_calls"
    return c.finish_reason


def _delta_tool_call(delta: ToolCallDelta) -> DeltaToolCall:
    """A call's first piece (its name) carries a new id and the type."""
    first = delta.name is not None
    return DeltaToolCall(
        index=delta.index,
        id=random_id("chatcmpl-tool") if first else None,
        type="function" if first else None,
        function=DeltaFunctionCall(name=delta.name, arguments=delta.arguments),
    )
