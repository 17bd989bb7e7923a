"""OpenAIServing: what every endpoint shares: the model name check (a served model or a
LoRA adapter, serving_models.py), tokenization and the context-length rule, SamplingParams
from a request, and running requests on the AsyncLLM (aborting them when the client goes
away).

The server tokenizes with its own AsyncTokenizer (off the event loop, so a huge prompt
stalls no other client); the engine thread's tokenizer stays the engine's alone.
"""

import functools
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from typing import TypeVar

from fastapi import Request

from pagedllm.engine.input_processor import check_priority, check_token_ids
from pagedllm.engine.protocol import EngineClient
from pagedllm.engine.tokenizer import model_eos_token_ids
from pagedllm.entrypoints.openai.async_tokenizer import AsyncTokenizer
from pagedllm.entrypoints.openai.errors import OpenAIError, engine_error, invalid_value_error
from pagedllm.entrypoints.openai.generic_tools import generic_conversations, tools_system_prompt
from pagedllm.entrypoints.openai.metrics import ServerMetrics
from pagedllm.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    SamplingFields,
    StreamOptions,
    TokenizeRequest,
    random_id,
)
from pagedllm.entrypoints.openai.request_id import header_made_here
from pagedllm.entrypoints.openai.request_logger import RequestLogger
from pagedllm.entrypoints.openai.serving_beam_search import (
    BeamSearchRequest,
    beam_search_outputs,
    beam_search_request,
)
from pagedllm.entrypoints.openai.serving_models import OpenAIServingModels
from pagedllm.entrypoints.openai.streaming import accumulate, prepend, until_disconnected
from pagedllm.entrypoints.openai.tool_choice import tool_choice_of
from pagedllm.entrypoints.openai.tool_parsers import GenericToolParser, ToolParser
from pagedllm.lora.request import LoRARequest
from pagedllm.outputs import RequestOutput
from pagedllm.sampling_params import SamplingParams, truncated_prompt
from pagedllm.value_checks import as_truncate_prompt_tokens

T = TypeVar("T")

# The routes that serve each of vLLM's pooling tasks, for the messages that point to them.
_TASK_ROUTES = {
    "embed": "/v1/embeddings",
    "classify": "/classify",
    "score": "/score and /rerank",
    "token_classify": "/pooling",
}


def pooling_routes(tasks: tuple[str, ...]) -> str:
    """The routes a pooling model's `tasks` answer: "/classify, /score and /rerank"."""
    return ", ".join(_TASK_ROUTES[task] for task in tasks)


def engine_prompt(text: str | None, token_ids: list[int], cache_salt: str | None) -> dict:
    """The prompt the engine takes (pagedllm/inputs.py): its text, its ids and the
    request's cache_salt, if it sent one."""
    prompt = {"prompt": text, "prompt_token_ids": token_ids}
    return prompt if cache_salt is None else {**prompt, "cache_salt": cache_salt}


class OpenAIServing:
    def __init__(
        self,
        engine: EngineClient,
        tokenizer: AsyncTokenizer,
        models: OpenAIServingModels,
        metrics: ServerMetrics,
        chat_template: str | None = None,
        tool_parser: type[ToolParser] = GenericToolParser,
    ) -> None:
        """`tokenizer` is the server's own (see the module docstring); `models`: the names
        it answers to, shared by the app's serving objects; `tool_parser`: what reads "auto"
        answers (the chat template's format, or --tool-call-parser)."""
        self.engine = engine
        self.async_tokenizer = tokenizer
        self.tokenizer = tokenizer.sync
        self.models = models
        self.metrics = metrics
        self.chat_template = chat_template
        self.tool_parser = tool_parser
        self.request_logger: RequestLogger | None = None  # --enable-log-requests
        self.default_chat_template_kwargs: dict = {}  # --default-chat-template-kwargs
        self.force_include_usage = False  # --enable-force-include-usage
        self.return_tokens_as_token_ids = False  # --return-tokens-as-token-ids
        config = engine.config
        self.max_model_len = config.model_config.max_model_len
        self.sampling_defaults = config.model_config.sampling_defaults
        self.max_tokens_cap = config.model_config.max_tokens_cap
        self.vocab_size = config.model_config.vocab_size

    def check_model(self, model: str | None) -> tuple[str, LoRARequest | None]:
        """The model name to answer with and the LoRA adapter to run (None: the base
        model); 404 for a name this server does not serve."""
        return self.models.resolve(model)

    def check_generates(self) -> None:
        """A 400 on a pooling server for the APIs that generate, before anything is queued
        (a background response included)."""
        config = self.engine.config.model_config
        if config.runner_type == "pooling":
            raise OpenAIError(
                "this model is a pooling model: it generates no text; use POST "
                f"{pooling_routes(config.pooling_tasks)}",
                param="model",
            )

    def check_priority(self, priority: int) -> None:
        """The engine's priority rule (input_processor.check_priority) as a 400 naming
        `priority`, before anything is queued (a background response included)."""
        try:
            check_priority(priority, self.engine.config.scheduler_config.policy)
        except (ValueError, TypeError) as e:
            raise OpenAIError(str(e), param="priority") from e

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

    def uses_generic_format(self, request: ChatCompletionRequest | TokenizeRequest) -> bool:
        """Whether the answer is read in the generic tool format (generic_tools.py prompts
        and constrains it): tool choice "auto" on a server whose format is the generic one.
        A tool choice the tools cannot meet is a 400."""
        auto = tool_choice_of(request) == "auto"
        return auto and issubclass(self.tool_parser, GenericToolParser)

    async def apply_chat_template(
        self, request: ChatCompletionRequest | TokenizeRequest
    ) -> tuple[str, list[int]]:
        """The prompt's text and token ids, as the chat endpoint renders them: the messages
        (where the generic tool format applies, with its prompt and the calls in the
        content), tools and template options through the chat template. Any failure of the
        template (it may raise on roles or orders it does not support) is the request's
        fault: a 400."""
        if request.add_generation_prompt and request.continue_final_message:
            raise OpenAIError(
                "continue_final_message needs add_generation_prompt=false (the answer "
                "continues the last message instead of starting a new one)",
                param="continue_final_message",
            )
        conversations = [[m.as_template_message() for m in request.messages]]
        if self.uses_generic_format(request):
            prompt = tools_system_prompt(request.tools)
            conversations = generic_conversations(conversations[0], prompt)
        kwargs = {**self.default_chat_template_kwargs, **request.template_kwargs()}
        errors = []  # a form the template refuses: try the next (generic_conversations)
        for conversation in conversations:
            try:
                return await self.async_tokenizer.apply_chat_template(
                    conversation, self.chat_template, kwargs
                )
            except Exception as e:  # noqa: BLE001 - templates raise anything
                errors.append(str(e))
        error = "; with the tools' prompt in the first user message: ".join(dict.fromkeys(errors))
        raise OpenAIError(f"cannot apply the chat template: {error}", param="messages")

    async def chat_prompt_ids(
        self, request: ChatCompletionRequest | TokenizeRequest, add_special_tokens: bool
    ) -> list[int]:
        """The messages' token ids through the chat template; `add_special_tokens` adds the
        tokenizer's special tokens on top of what the template places, as vLLM does."""
        text, ids = await self.apply_chat_template(request)
        return await self.encode(text, True) if add_special_tokens else ids

    def truncated(self, token_ids: list[int], keep: int | None) -> list[int]:
        """vLLM's truncate_prompt_tokens, by this server's max_model_len; a bad count (one
        over max_model_len included) is a 400 naming it, before any other check reads the
        cut prompt."""
        try:
            return truncated_prompt(token_ids, as_truncate_prompt_tokens(keep), self.max_model_len)
        except (ValueError, TypeError) as e:
            raise OpenAIError(str(e), param="truncate_prompt_tokens") from e

    def forced_usage(self, request: SamplingFields) -> None:
        """vLLM's --enable-force-include-usage: a stream carries the usage in every chunk
        and at its end, whatever its stream_options say."""
        if self.force_include_usage and request.stream:
            request.stream_options = StreamOptions(include_usage=True, continuous_usage_stats=True)

    def as_token_ids(self, request: SamplingFields) -> bool:
        """Whether logprobs name tokens `token_id:<id>`: the request's
        `return_tokens_as_token_ids`, else the server's --return-tokens-as-token-ids."""
        asked = request.return_tokens_as_token_ids
        return self.return_tokens_as_token_ids if asked is None else asked

    def max_tokens(
        self, requested: int | None, prompt_len: int, param: str, limit_param: str = "max_tokens"
    ) -> int:
        """vLLM's context rule: prompt + max_tokens must fit in max_model_len; no max_tokens
        means the model's default (its generation config's) within the room left, else all
        of it; override_generation_config's max_new_tokens caps either (vLLM's). A
        max_tokens < 1 is left for SamplingParams to reject. `limit_param`: the request's
        name for the limit (chat's max_completion_tokens)."""
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
        cap = self.max_tokens_cap
        if requested is None:
            room = limit - prompt_len
            return min(self.sampling_defaults.get("max_tokens", room), room, cap or room)
        if requested >= 1 and prompt_len + requested > limit:
            raise OpenAIError(
                f"This model's maximum context length is {limit} tokens. However, you "
                f"requested {prompt_len + requested} tokens ({prompt_len} in the {param}, "
                f"{requested} in the completion). Reduce the {param} or {limit_param}.",
                param=limit_param,
                code="context_length_exceeded",
            )
        return min(requested, cap) if cap is not None and requested >= 1 else requested

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
            params = request.sampling_params(
                max_tokens, logprobs, prompt_logprobs, self.sampling_defaults
            )
        except (ValueError, TypeError) as e:
            raise invalid_value_error(e, type(request).model_fields) from e
        return params

    # Running requests.

    def request_id(
        self, prefix: str, raw_request: Request | None, body_id: str | None = None
    ) -> str:
        """vLLM's: `prefix-` and the client's X-Request-Id header if it sent one, else the
        body's `request_id` (`body_id`), else a random id. The engine, the logs and the
        response all use it. An id a request in flight already runs under (a client's
        retry) gets a random suffix, as vLLM's engine ids do, so that neither request fails
        for the other."""
        given = None if raw_request is None else raw_request.headers.get("X-Request-Id")
        if body_id and (not given or header_made_here(raw_request)):
            given = body_id
        if not given:
            return random_id(prefix)
        request_id = f"{prefix}-{given}"
        if self.engine.has_request(request_id) or self.engine.has_request(f"{request_id}-0"):
            request_id = random_id(request_id)
        return request_id

    def generate(
        self,
        prompt: dict,
        params: SamplingParams | BeamSearchRequest,
        request_id: str,
        arrival_time: float,
        priority: int = 0,
        lora_request: LoRARequest | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """The request's outputs: sampled as `params` say, or a beam search's one output;
        with `lora_request`, the adapter's."""
        if isinstance(params, BeamSearchRequest):
            eos = self.eos_token_ids
            outputs = beam_search_outputs(
                self.engine, self.tokenizer, prompt, params, request_id, eos, priority, lora_request
            )
            params = params.request_params
        else:
            outputs = self.engine.generate(
                prompt, params, request_id, priority, lora_request=lora_request
            )
        outputs = self.logged(request_id, prompt, params, outputs, lora_request)
        return self.metrics.track(outputs, arrival_time, params)

    @functools.cached_property
    def eos_token_ids(self) -> list[int]:
        """The ids that end a beam (read once, at the first beam search)."""
        return model_eos_token_ids(self.engine.config.model_config, self.tokenizer)

    def beam_search_request(
        self, request: SamplingFields, params: SamplingParams
    ) -> BeamSearchRequest | None:
        """serving_beam_search.beam_search_request, with this engine's max_logprobs and
        max_n (None without use_beam_search)."""
        if not request.use_beam_search:
            return None
        config = self.engine.config
        return beam_search_request(request, params, config.max_logprobs, config.max_n)

    def logged(
        self,
        request_id: str,
        prompt: dict,
        params: object,
        outputs: AsyncIterator[T],
        lora_request: LoRARequest | None = None,
    ) -> AsyncIterator[T]:
        """`outputs` of the request, logged (its submission, with its LoRA adapter, and an
        abort) with --enable-log-requests."""
        if self.request_logger is None:
            return outputs
        self.request_logger.log(request_id, prompt, params, lora_request)
        return self.request_logger.watch(request_id, outputs)

    async def prime(
        self, outputs: AsyncIterator[T], raw_request: Request | None
    ) -> AsyncIterator[T]:
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
        return prepend(first, outputs)

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
