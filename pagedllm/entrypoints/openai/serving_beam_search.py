"""`use_beam_search` on /v1/completions and /v1/chat/completions (vLLM's): the search of
`LLM.beam_search` (pagedllm/beam_search.py, `beam_search_async`) run on the AsyncLLM, a
prompt's `n` best beams the choices of one finished RequestOutput.

The request's fields the search applies: `n` (the beam width), `length_penalty`,
`max_tokens`, `temperature` (the request's, else the model's default, else 1, as vLLM's;
0 makes the search deterministic), `ignore_eos`, `include_stop_str_in_output` (a choice's
token ids end with its EOS only then, as vLLM's) and, for the answer, `logprobs` (each
token's step candidates), `skip_special_tokens` and `truncate_prompt_tokens`. A choice's
text is its tokens decoded, a final EOS left out. A sampling field it would not apply
(stop, top_p, penalties, a constraint, ...) is a 400, not dropped.
"""

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass, fields

from transformers import PreTrainedTokenizerBase

from pagedllm.beam_search import BeamSearchSequence, beam_search_async, check_beam_width
from pagedllm.engine.protocol import EngineClient
from pagedllm.entrypoints.openai.errors import OpenAIError, invalid_value_error
from pagedllm.entrypoints.openai.protocol import SamplingFields, random_id
from pagedllm.inputs import cache_salt_of
from pagedllm.lora.request import LoRARequest
from pagedllm.outputs import CompletionOutput, Logprob, RequestOutput
from pagedllm.sampling_params import REQUEST_FIELDS, BeamSearchParams, SamplingParams

_APPLIED = {
    "n",
    "temperature",
    "ignore_eos",
    "include_stop_str_in_output",
    "skip_special_tokens",
    "truncate_prompt_tokens",
}

_SEARCH_FIELDS = [f.name for f in fields(BeamSearchParams)]


@dataclass(frozen=True)
class BeamSearchRequest:
    """A request's beam search: `params` the search's; `request_params` the request's own
    sampling params (its `n`, `max_tokens`, `logprobs` and `skip_special_tokens`: what the
    answer shows; what the server's metrics and logs see)."""

    params: BeamSearchParams
    request_params: SamplingParams


def beam_search_request(
    request: SamplingFields, params: SamplingParams, max_logprobs: int, max_n: int
) -> BeamSearchRequest | None:
    """The request's beam search if it asks for one (`use_beam_search`), else None;
    `params`: its sampling params as the server built them (defaults and constraint
    included). A field the search does not apply, or a value it cannot take (the engine's
    max_logprobs and max_n bound the width), is a 400 naming it."""
    if not request.use_beam_search:
        return None
    fields = type(request).model_fields
    for name in REQUEST_FIELDS:
        value = getattr(request, name)
        if name not in _APPLIED and value != fields[name].default:
            raise _not_applied(name, f"{name}={value!r}")
    if params.structured_outputs is not None:
        raise _not_applied(
            "structured_outputs",
            "a constraint (response_format, structured_outputs, or tool_choice's)",
        )
    if params.prompt_logprobs is not None:
        raise _not_applied("logprobs", "the prompt's logprobs (echo with logprobs)")
    try:
        search = BeamSearchParams(
            beam_width=params.n,
            max_tokens=params.max_tokens,
            ignore_eos=params.ignore_eos,
            temperature=params.temperature,
            length_penalty=request.length_penalty,
            include_stop_str_in_output=params.include_stop_str_in_output,
        )
        check_beam_width(search, max_logprobs, max_n)
    except (ValueError, TypeError) as e:
        raise _invalid(e) from e
    return BeamSearchRequest(search, params)


def _invalid(error: ValueError | TypeError) -> OpenAIError:
    """A 400 for a BeamSearchParams value, naming the request's field (`n` for the
    search's beam_width)."""
    param = invalid_value_error(error, _SEARCH_FIELDS).param
    return OpenAIError(f"use_beam_search: {error}", param="n" if param == "beam_width" else param)


def _not_applied(param: str, what: str) -> OpenAIError:
    return OpenAIError(
        f"use_beam_search applies n, max_tokens, temperature, length_penalty, ignore_eos "
        f"and include_stop_str_in_output only; {what} cannot be combined with it",
        param=param,
    )


async def beam_search_outputs(
    engine: EngineClient,
    tokenizer: PreTrainedTokenizerBase,
    prompt: dict,
    search: BeamSearchRequest,
    request_id: str,
    eos_token_ids: list[int],
    priority: int = 0,
    lora_request: LoRARequest | None = None,
) -> AsyncIterator[RequestOutput]:
    """The search's one output: `prompt`'s (text and token ids) best beams as choices,
    finished. Each step's requests run as `{request_id}-beam-<random hex>-{i}` (as vLLM's:
    no two searches' steps share an id, even under one client's id), at the request's
    `priority`, with its `lora_request` and under its prompt's `cache_salt` (BeamSearch
    puts it on them); closing this iterator mid-search aborts them."""

    async def generate(requests: list[dict], step: SamplingParams) -> list[RequestOutput]:
        step_id = random_id(f"{request_id}-beam")
        runs = [
            _last(engine.generate(r, step, f"{step_id}-{i}", priority, lora_request=lora_request))
            for i, r in enumerate(requests)
        ]
        return await asyncio.gather(*runs)

    prompt_ids = prompt["prompt_token_ids"]
    max_model_len = engine.config.model_config.max_model_len
    result = await beam_search_async(
        generate, prompt_ids, search.params, eos_token_ids, max_model_len, cache_salt_of(prompt)
    )
    choices = [
        _choice(i, beam, len(prompt_ids), search, tokenizer)
        for i, beam in enumerate(result.sequences)
    ]
    yield RequestOutput(request_id, prompt.get("prompt"), prompt_ids, None, choices, True)


async def _last(outputs: AsyncIterator[RequestOutput]) -> RequestOutput:
    """A one-token request's final output; its error, if it failed, is raised."""
    last = None
    async with aclosing(outputs):
        async for last in outputs:  # noqa: B007 - the last one is wanted
            pass
    if last.error is not None:
        raise last.error
    return last


def _choice(
    index: int,
    beam: BeamSearchSequence,
    prompt_len: int,
    search: BeamSearchRequest,
    tokenizer: PreTrainedTokenizerBase,
) -> CompletionOutput:
    """A beam as choice `index`: its generated tokens (a final EOS only with
    include_stop_str_in_output), their text (without the EOS) and, if asked, logprobs."""
    generated = beam.tokens[prompt_len:]
    text_ids = generated[:-1] if beam.finish_reason == "stop" else generated  # EOS: "stop"
    token_ids = generated if search.params.include_stop_str_in_output else text_ids
    request = search.request_params
    text = tokenizer.decode(text_ids, skip_special_tokens=request.skip_special_tokens)
    logprobs = None
    if request.logprobs is not None:
        logprobs = [_top(step, t, request.logprobs) for step, t in zip(beam.logprobs, token_ids)]
    return CompletionOutput(index, text, token_ids, beam.cum_logprob, logprobs, beam.finish_reason)


def _top(candidates: dict[int, Logprob], token_id: int, k: int) -> dict[int, Logprob]:
    """The chosen token and the `k` most likely of a step's candidates, as the engine's
    logprobs give them."""
    ranked: Sequence[int] = sorted(candidates, key=lambda t: -candidates[t].logprob)[:k]
    return {t: candidates[t] for t in dict.fromkeys([token_id, *ranked])}
