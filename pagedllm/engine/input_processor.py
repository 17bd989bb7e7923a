"""InputProcessor: a user's prompt and SamplingParams -> a validated Request (or, on a
pooling model, its prompt and PoolingParams -> a validated PoolingRequest).

The only place requests are checked against the engine: the sampling parameters against
the model (vocabulary, logprobs cap, max_n, the logits processors' own checks), the prompt
(tokenized here when it is text; its cache_salt checked) against the vocabulary and
max_model_len, the priority against the scheduling policy, the fan-out against the KV
cache, and the structured-output constraint (checked here, then compiled off the engine
thread). A bad request raises ValueError/TypeError and changes nothing.
"""

from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import replace

import torch
from transformers import PreTrainedTokenizerBase

from pagedllm.config import EngineConfig
from pagedllm.core.sequence import Sequence as Seq
from pagedllm.core.sequence import new_seq_id
from pagedllm.engine.detokenizer import make_detokenizer
from pagedllm.engine.pooling_request import PoolingRequest
from pagedllm.engine.request import Completion, Request
from pagedllm.inputs import PromptType as UserPrompt
from pagedllm.inputs import cache_salt_of, check_prompt_dict
from pagedllm.lora.registry import LoRARegistry
from pagedllm.pooling_params import PoolingParams
from pagedllm.sampling_params import SamplingParams, truncated_prompt
from pagedllm.structured_output import GrammarMatcher, StructuredOutputManager
from pagedllm.value_checks import as_int

PromptType = UserPrompt | list[int]
"""vLLM's prompt types (pagedllm/inputs.py), or bare token ids, which the engine takes too
(LLM.generate refuses them as ambiguous)."""

_TASK_USE = {
    "embed": "embed (POST /v1/embeddings)",
    "classify": "classify (POST /classify)",
    "score": "score (POST /score, /rerank)",
    "token_classify": "encode(pooling_task='token_classify') (POST /pooling)",
}
"""What serves each pooling task: the LLM method and the server's routes."""


def check_token_ids(token_ids: Sequence[int], vocab_size: int, name: str = "prompt") -> None:
    """Token ids must be ints in [0, vocab_size); the message names `name`."""
    bad = [
        t
        for t in token_ids
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab_size
    ]
    if bad:
        raise ValueError(f"{name} token ids {bad[:5]} are outside the vocabulary [0, {vocab_size})")


def prompt_text_and_ids(
    prompt: PromptType, tokenizer: PreTrainedTokenizerBase | None
) -> tuple[str | None, list[int]]:
    """A prompt's text (if it has one) and token ids: a text prompt tokenized with
    `tokenizer`'s special tokens, token ids as they are (vLLM's prompt forms)."""
    text, token_ids = None, None
    if isinstance(prompt, dict):
        check_prompt_dict(prompt)
        text, token_ids = prompt.get("prompt"), prompt.get("prompt_token_ids")
    elif isinstance(prompt, str):
        text = prompt
    elif isinstance(prompt, list | tuple):
        token_ids = list(prompt)
    else:
        raise TypeError(f"prompt must be a str, a list of token ids or a dict, got {prompt!r}")
    if token_ids is None:
        if text is None:
            raise ValueError("prompt dict needs 'prompt' or 'prompt_token_ids'")
        if tokenizer is None:
            raise ValueError("text prompts need a tokenizer (skip_tokenizer_init is set)")
        token_ids = tokenizer.encode(text)
    return text, list(token_ids)


def check_priority(priority: int, policy: str) -> None:
    """vLLM's rule: a request's priority is an int (signed 64-bit, as every int field), and
    only 0 unless the engine schedules by priority (`policy`). The server checks it too,
    before it queues anything (serving_engine.OpenAIServing.check_priority)."""
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise TypeError(f"priority must be an int, got {type(priority).__name__}")
    as_int("priority", priority, "an int")
    if priority != 0 and policy != "priority":
        raise ValueError(
            f"Got priority {priority} but priority scheduling is not enabled: start the "
            "engine with scheduling_policy='priority' (--scheduling-policy priority), "
            "or send priority 0"
        )


class InputProcessor:
    def __init__(
        self,
        config: EngineConfig,
        tokenizer: PreTrainedTokenizerBase | None,
        eos_token_id: int | None,
        generation_config: dict,
        validate_params: Callable[[SamplingParams], None],
        num_kv_blocks: int,
        structured_output: StructuredOutputManager | None = None,
        lora_registry: LoRARegistry | None = None,
    ) -> None:
        """`validate_params`: the logits processors' checks of a request's params;
        `structured_output` compiles the requests' constraints (None: none accepted)."""
        self.config = config
        self.tokenizer = tokenizer
        self.eos_token_id = eos_token_id
        self.generation_config = generation_config
        self.validate_params = validate_params
        self.num_kv_blocks = num_kv_blocks
        self.structured_output = structured_output
        self.lora_registry = lora_registry or LoRARegistry(None, {})

    def process(
        self,
        request_id: str,
        prompt: PromptType,
        params: SamplingParams | None,
        arrival_time: float | None = None,
        priority: int = 0,
        lora_request: object = None,
    ) -> Request:
        """A Request with its first sequence (its n completions fork at the first token),
        run with `lora_request`'s adapter (None: the base model)."""
        check_priority(priority, self.config.scheduler_config.policy)
        lora = self.lora_registry.check(lora_request)
        params = self._prepare_params(params)
        text, token_ids = self._tokenize(prompt, params.truncate_prompt_tokens)
        self._check_fits_cache(len(token_ids), params)
        request = Request(request_id, text, token_ids, params, arrival_time)
        block_size = self.config.cache_config.block_size
        seq = Seq(
            new_seq_id(),
            token_ids,
            block_size,
            params,
            request_id,
            request.arrival_time,
            priority,
            cache_salt_of(prompt),
            lora,
        )
        seq.skip_prefix_cache = params.prompt_logprobs is not None
        detokenizer = make_detokenizer(self.tokenizer, token_ids, params)
        request.completions.append(Completion(0, seq, detokenizer))
        request.generators = [self._generator(params, k) for k in range(params.n)]
        request.compiling_matchers = self._compile(params)
        self.lora_registry.keep(lora)  # the request passed every check
        return request

    def process_pooling(
        self,
        request_id: str,
        prompt: PromptType,
        params: PoolingParams | None,
        arrival_time: float | None = None,
        priority: int = 0,
    ) -> PoolingRequest:
        """A PoolingRequest whose one sequence runs its prompt's prefill only."""
        check_priority(priority, self.config.scheduler_config.policy)
        model_config = self.config.model_config
        if model_config.runner_type != "pooling":
            raise ValueError(
                "this model generates (runner='generate'); pooling requests (embeddings) "
                "need a pooling model: set runner='pooling' (--runner pooling)"
            )
        params = PoolingParams() if params is None else params
        if not isinstance(params, PoolingParams):
            raise TypeError(f"pooling params must be PoolingParams, got {type(params)}")
        params = replace(params, task=params.verify_task(model_config.pooling_tasks))
        size = model_config.pooled_size
        params.verify(size, model_config.is_matryoshka, model_config.matryoshka_dimensions)
        text, token_ids = self._tokenize(prompt, params.truncate_prompt_tokens)
        block_size = self.config.cache_config.block_size
        seq = Seq(new_seq_id(), token_ids, block_size, params, request_id, priority=priority)
        seq.skip_prefix_cache = True
        request = PoolingRequest(request_id, text, token_ids, params, seq, arrival_time)
        seq.arrival_time = request.arrival_time
        return request

    def _prepare_params(self, params: SamplingParams | None) -> SamplingParams:
        model_config = self.config.model_config
        if model_config.runner_type == "pooling":
            use = " or ".join(_TASK_USE[task] for task in model_config.pooling_tasks)
            raise ValueError(
                "this model is a pooling model (runner='pooling'): it "
                f"{'embeds' if 'embed' in model_config.pooling_tasks else 'classifies'} "
                f"prompts and generates no text; use {use}"
            )
        params = SamplingParams() if params is None else params
        if not isinstance(params, SamplingParams):
            raise TypeError(f"sampling params must be SamplingParams, got {type(params)}")
        params = params.clone()
        params.update_from_generation_config(self.generation_config, self.eos_token_id)
        if self.tokenizer is not None:
            params.update_from_tokenizer(self.tokenizer)
        else:
            needs_text = [name for name in ("stop", "bad_words") if getattr(params, name)]
            if needs_text:
                raise ValueError(
                    f"{needs_text[0]} needs the tokenizer (text to search or words to "
                    "tokenize), and this engine has none (skip_tokenizer_init=True)"
                )
        config = self.config
        params.verify(config.model_config.vocab_size, config.max_logprobs, config.max_n)
        self.validate_params(params)
        return params

    def _tokenize(
        self, prompt: PromptType, keep: int | None = None
    ) -> tuple[str | None, list[int]]:
        """The prompt's text (if it has one) and token ids, cut to the last `keep` (vLLM's
        truncate_prompt_tokens; -1: max_model_len), then checked."""
        text, token_ids = prompt_text_and_ids(prompt, self.tokenizer)
        token_ids = truncated_prompt(token_ids, keep, self.config.model_config.max_model_len)
        self._check_prompt_ids(token_ids)
        return text, token_ids

    def _check_prompt_ids(self, token_ids: list[int]) -> None:
        model_config = self.config.model_config
        if not token_ids:
            raise ValueError("the prompt is empty (0 tokens); give at least 1 token")
        check_token_ids(token_ids, model_config.vocab_size)
        if len(token_ids) > model_config.max_model_len:
            raise ValueError(
                f"the prompt has {len(token_ids)} tokens, more than "
                f"max_model_len={model_config.max_model_len}"
            )

    def _check_fits_cache(self, num_prompt_tokens: int, params: SamplingParams) -> None:
        """Bound the fan-out: n completions of up to max_tokens each (None: up to
        max_model_len) may produce no more tokens than the whole KV cache holds. (Each one
        alone always fits: the cache holds max_model_len; the scheduler runs them in turn.)"""
        max_new = self.config.model_config.max_model_len - num_prompt_tokens
        if params.max_tokens is not None:
            max_new = min(max_new, params.max_tokens)
        capacity = self.num_kv_blocks * self.config.cache_config.block_size
        if params.n * max_new > capacity:
            raise ValueError(
                f"n={params.n} completions of up to {max_new} tokens each may generate "
                f"{params.n * max_new} tokens, more than the KV cache holds ({capacity} "
                "tokens); lower n or max_tokens"
            )

    def _compile(self, params: SamplingParams) -> "Future[list[GrammarMatcher]] | None":
        """The compile of one grammar matcher per completion, started after checking the
        schema, regex or grammar (ValueError naming it); None without a constraint."""
        if params.structured_outputs is None:
            return None
        if self.structured_output is None:
            raise ValueError("structured_outputs are not supported by this engine")
        so, n = params.structured_outputs, params.n
        return self.structured_output.submit(so, n, params.reasoning_tokens)

    def _generator(self, params: SamplingParams, index: int) -> torch.Generator | None:
        """Completion `index` of a seeded request draws from its own generator."""
        if params.seed is None:
            return None
        return torch.Generator(self.config.device).manual_seed(params.seed + index)
