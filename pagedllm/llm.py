"""LLM: the offline API (vLLM's `LLM`): generate and chat over a batch of prompts, or, on
a pooling model, encode, embed and score them."""

import itertools
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace

from tqdm.auto import tqdm

from pagedllm.beam_search import BeamSearchOutput, beam_search, check_beam_width
from pagedllm.engine.arg_utils import EngineArgs
from pagedllm.engine.chat_messages import render_chat, template_message
from pagedllm.engine.data_parallel import make_engine
from pagedllm.engine.input_processor import prompt_text_and_ids
from pagedllm.engine.stat_logger import LoggingStatLogger, kv_cache_label, log_stats_interval
from pagedllm.engine.tokenizer import model_eos_token_ids
from pagedllm.inputs import PromptType, TokensPrompt, cache_salt_of
from pagedllm.lora.request import LoRARequest
from pagedllm.outputs import (
    ClassificationRequestOutput,
    EmbeddingRequestOutput,
    PoolingRequestOutput,
    RequestOutput,
    ScoringRequestOutput,
)
from pagedllm.pooling_params import PoolingParams
from pagedllm.sampling_params import (
    BeamSearchParams,
    RequestOutputKind,
    SamplingParams,
    truncation_size,
)
from pagedllm.scoring import (
    as_score_inputs,
    check_cross_encoder,
    check_score_lengths,
    cosine_scores,
    cross_encoder_prompt,
    cross_encoder_scores,
    paired,
)
from pagedllm.value_checks import as_truncate_prompt_tokens

ChatMessages = list[dict[str, str]]


class LLM:
    """Load a model once, then generate for many prompts with continuous batching.

    `model` is a HF folder, a .gguf file, or None for the embedded SmolLM2-135M-Instruct.
    The other arguments are EngineArgs fields (dtype "auto" is bf16 on GPUs and on CPUs with
    native bf16 matmuls, float32 on other CPUs; it is the activations' dtype when weights
    are quantized). `quantization`: None runs a GGUF file's
    tensors as stored and a HF checkpoint in `dtype`; "int8" quantizes a HF checkpoint's
    weights at load to 8-bit blocks; "none" dequantizes a GGUF file at load.
    `data_parallel_size` N > 1 runs N engine replicas, each in its own process with its own
    KV cache (and tensor-parallel workers), and spreads the prompts over them; results come
    back in input order all the same. `disable_log_stats=False` logs vLLM's periodic stats
    lines while it generates (off by default, as vLLM's LLM).
    """

    def __init__(self, model: str | None = None, **kwargs: object) -> None:
        kwargs.setdefault("disable_log_stats", True)
        engine_args = EngineArgs(model=model, **kwargs)
        interval = None if engine_args.disable_log_stats else log_stats_interval()
        self.llm_engine = make_engine(engine_args)
        self.stat_logger: LoggingStatLogger | None = None
        if interval is not None:
            stats = self.llm_engine.get_stats_per_engine()
            label = kv_cache_label(self.llm_engine.config.device)
            self.stat_logger = LoggingStatLogger(stats, interval, label)
        self._request_counter = itertools.count()
        # One call at a time drives the engine: calls from several threads take turns.
        self._lock = threading.Lock()

    def close(self) -> None:
        """Stop tensor-parallel workers now (dropping the LLM does it too)."""
        self.llm_engine.shutdown()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def get_tokenizer(self):  # noqa: ANN201 - a transformers tokenizer
        if self.llm_engine.tokenizer is None:  # vLLM's error
            raise ValueError("Unable to get tokenizer because skip_tokenizer_init is True")
        return self.llm_engine.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """vLLM's: the sampling params of a call that gives none: the model's recommended
        ones from its generation config (`generation_config`, sampling_defaults.py) over
        SamplingParams' defaults."""
        return SamplingParams(**self.llm_engine.config.model_config.sampling_defaults)

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        *,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
        priority: list[int] | None = None,
    ) -> list[RequestOutput]:
        """One RequestOutput per prompt, in input order; no sampling params: the defaults
        get_default_sampling_params gives (the model's generation config). `priority`
        (vLLM's): one per prompt, lower served first, nonzero only with
        scheduling_policy="priority". `lora_request` (vLLM's; needs enable_lora): the LoRA
        adapter every prompt runs with, or one per prompt (docs/lora.md). A prompt dict's
        `cache_salt` keeps its prefix-cache blocks to prompts of the same salt."""
        prompts = _as_prompt_list(prompts)
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
        params = _as_params_list(sampling_params, len(prompts))
        priorities = _as_priority_list(priority, len(prompts))
        loras = _as_lora_list(lora_request, len(prompts))
        return self._run(prompts, [_final_only(p) for p in params], use_tqdm, priorities, loras)

    def beam_search(
        self,
        prompts: Sequence[PromptType],
        params: BeamSearchParams,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
        use_tqdm: bool = False,
        concurrency_limit: int | None = None,
    ) -> list[BeamSearchOutput]:
        """vLLM's beam search (beam_search.py): per prompt (a str, TextPrompt or
        TokensPrompt) a BeamSearchOutput of its `beam_width` best sequences, best first,
        each with its tokens (the prompt's included), cumulative logprob and text (the
        whole sequence's, as vLLM's; None without a tokenizer). `concurrency_limit`
        searches that many prompts at a time; `use_tqdm` shows progress over them. A prompt
        dict's `cache_salt` goes on every step of its search, as in `generate`, and so does
        its LoRA adapter (`lora_request`: one for all prompts, or one per prompt)."""
        if not isinstance(params, BeamSearchParams):
            raise TypeError(f"params must be a BeamSearchParams, got {type(params).__name__}")
        config = self.llm_engine.config
        check_beam_width(params, config.max_logprobs, config.max_n)
        tokenizer = self.llm_engine.tokenizer  # None: token prompts only, no text
        prompts = _as_prompt_list(prompts)
        token_prompts = [prompt_text_and_ids(p, tokenizer)[1] for p in prompts]
        salts = [cache_salt_of(p) for p in prompts]
        loras = _as_lora_list(lora_request, len(prompts))
        eos = model_eos_token_ids(config.model_config, tokenizer)
        limit = concurrency_limit or len(token_prompts) or 1
        decode = tokenizer.decode if tokenizer is not None else lambda ids: None
        # Prompts searched together share an adapter (a step's requests all take one).
        groups = [
            (lora, indices[start : start + limit])
            for lora, indices in _indices_by_lora(loras).items()
            for start in range(0, len(indices), limit)
        ]
        outputs: list[BeamSearchOutput | None] = [None] * len(prompts)
        for lora, indices in tqdm(groups, desc="Beam search", disable=not use_tqdm):
            found = beam_search(
                lambda batch, step, lora=lora: self.generate(
                    batch, step, use_tqdm=False, lora_request=lora
                ),
                [token_prompts[i] for i in indices],
                params,
                eos,
                config.model_config.max_model_len,
                decode,
                [salts[i] for i in indices],
            )
            for i, output in zip(indices, found, strict=True):
                outputs[i] = output
        return outputs

    def chat(
        self,
        messages: ChatMessages | Sequence[ChatMessages],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
        chat_template_kwargs: dict | None = None,
        continue_final_message: bool = False,
        tools: list[dict] | None = None,
        *,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
        chat_template_content_format: str = "auto",
    ) -> list[RequestOutput]:
        """Apply the tokenizer's chat template to each conversation, then generate.
        Messages are read as OpenAI's (engine/chat_messages.py: text parts joined, tool
        call arguments parsed); `tools` (OpenAI's tool definitions) and
        `continue_final_message` go to the template, as in vLLM's `LLM.chat`. A message
        or template the conversation cannot go through is a ValueError. vLLM's
        `chat_template_content_format` may be "auto" or "string" (content reaches the
        template as a string). `lora_request`: as `generate`'s, one per conversation."""
        check_vllm_options(content_format=chat_template_content_format)
        tokenizer = self.get_tokenizer()
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = []
        for conversation in conversations:
            conversation = [template_message(m, i) for i, m in enumerate(conversation)]
            text, ids = render_chat(
                tokenizer,
                conversation,
                chat_template=chat_template,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                tools=tools,
                **(chat_template_kwargs or {}),
            )
            # The text is the output's `prompt`, as vLLM's LLM.chat gives it.
            prompts.append({"prompt": text, "prompt_token_ids": ids})
        return self.generate(prompts, sampling_params, use_tqdm, lora_request=lora_request)

    def encode(
        self,
        prompts: PromptType | Sequence[PromptType],
        pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
        use_tqdm: bool = True,
        *,
        truncate_prompt_tokens: int | None = None,
        pooling_task: str | None = None,
        lora_request: object = None,
    ) -> list[PoolingRequestOutput]:
        """A pooling model's pooled vector per prompt (`outputs.data`, a float32 tensor: an
        embedding, a classifier's label scores, or a token classifier's [num_tokens,
        num_labels] scores of every prompt token), in input order. vLLM's
        `truncate_prompt_tokens` sets every prompt's params' own; `pooling_task` ("embed",
        "classify", "score" or "token_classify", one of the model's) sets their task."""
        if lora_request is not None:
            raise ValueError("lora_request: pooling models serve no LoRA adapters; pass None")
        prompts = _as_prompt_list(prompts)
        params = _as_params_list(pooling_params, len(prompts), PoolingParams)
        if truncate_prompt_tokens is not None:
            params = [replace(p, truncate_prompt_tokens=truncate_prompt_tokens) for p in params]
        if pooling_task is not None:
            params = [_with_task(p, pooling_task) for p in params]
        outputs = self._run(prompts, params, use_tqdm)
        for output in outputs:
            if output.error is not None:
                raise output.error
        return outputs

    def embed(
        self,
        prompts: PromptType | Sequence[PromptType],
        pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
        use_tqdm: bool = True,
        *,
        truncate_prompt_tokens: int | None = None,
        lora_request: object = None,
    ) -> list[EmbeddingRequestOutput]:
        """vLLM's `LLM.embed`: one embedding per prompt (`outputs.embedding`, a list of
        floats), in input order."""
        self._check_pooling_task("embed", "LLM.embed()")
        outputs = self.encode(
            prompts,
            pooling_params,
            use_tqdm,
            truncate_prompt_tokens=truncate_prompt_tokens,
            pooling_task="embed",
            lora_request=lora_request,
        )
        return [EmbeddingRequestOutput.from_base(o) for o in outputs]

    def classify(
        self,
        prompts: PromptType | Sequence[PromptType],
        pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
        use_tqdm: bool = True,
        *,
        truncate_prompt_tokens: int | None = None,
        lora_request: object = None,
    ) -> list[ClassificationRequestOutput]:
        """vLLM's `LLM.classify` on a classifier (`*ForSequenceClassification`): each
        prompt's label scores (`outputs.probs`, after the model's activation), in input
        order."""
        self._check_pooling_task("classify", "LLM.classify()")
        outputs = self.encode(
            prompts,
            pooling_params,
            use_tqdm,
            truncate_prompt_tokens=truncate_prompt_tokens,
            pooling_task="classify",
            lora_request=lora_request,
        )
        return [ClassificationRequestOutput.from_base(o) for o in outputs]

    def _check_pooling_task(self, task: str, api: str) -> None:
        """vLLM's refusals: a generating model pools nothing; a classifier does not embed
        and an embedding model does not classify."""
        model_config = self.llm_engine.config.model_config
        if model_config.runner_type != "pooling":
            how = (
                "a *ForSequenceClassification checkpoint, or this one converted with "
                "hf_overrides (docs/classification.md)"
                if task == "classify"
                else "runner='pooling' (--runner pooling) to use the model as an embedding model"
            )
            raise ValueError(f"{api} is only supported for pooling models; use {how}")
        if task == "score" and model_config.classifier_config is not None:
            check_cross_encoder(model_config.classifier_config)
        if task not in model_config.pooling_tasks:
            tasks = model_config.pooling_tasks
            use = (
                ": use LLM.encode(prompts, pooling_task='token_classify')"
                if "token_classify" in tasks
                else ""
            )
            raise ValueError(
                f"{api}: this model is {model_config.pooling_kind}; its pooling tasks are "
                f"{', '.join(tasks)}{use}"
            )

    def score(
        self,
        data_1: PromptType | Sequence[PromptType],
        data_2: PromptType | Sequence[PromptType],
        /,
        *,
        use_tqdm: bool = True,
        pooling_params: PoolingParams | None = None,
        truncate_prompt_tokens: int | None = None,
        lora_request: object = None,
        chat_template: str | None = None,
    ) -> list[ScoringRequestOutput]:
        """vLLM's `LLM.score`: one ScoringRequestOutput per pair, in order. An embedding
        model scores the cosine similarity of each pair's embeddings; a classifier with one
        label (a cross-encoder or reranker) scores each pair as one prompt (its two texts
        through `chat_template` where given, pagedllm/scoring.py). One prompt against N
        gives N scores, N against N pairs them; any other lengths raise ValueError."""
        self._check_pooling_task("score", "LLM.score()")
        prompts_1, prompts_2 = as_score_inputs(data_1), as_score_inputs(data_2)
        check_score_lengths(len(prompts_1), len(prompts_2), ("data_1", "data_2"))
        if self.llm_engine.config.model_config.is_cross_encoder:
            return self._cross_encoder_score(
                prompts_1,
                prompts_2,
                use_tqdm,
                pooling_params,
                truncate_prompt_tokens,
                chat_template,
                lora_request,
            )
        if chat_template is not None:
            raise ValueError(
                "chat_template: a score template formats a cross-encoder's pair; an "
                "embedding model embeds each text on its own"
            )
        outputs = self.encode(
            prompts_1 + prompts_2,
            pooling_params,
            use_tqdm,
            truncate_prompt_tokens=truncate_prompt_tokens,
            pooling_task="embed",
            lora_request=lora_request,
        )
        tokenizer = self.llm_engine.tokenizer
        pad_token_id = None if tokenizer is None else tokenizer.pad_token_id
        split = len(prompts_1)
        return cosine_scores(outputs[:split], outputs[split:], pad_token_id)

    def _cross_encoder_score(
        self,
        prompts_1: list[PromptType],
        prompts_2: list[PromptType],
        use_tqdm: bool,
        pooling_params: PoolingParams | None,
        truncate_prompt_tokens: int | None,
        score_template: str | None,
        lora_request: object,
    ) -> list[ScoringRequestOutput]:
        """Each pair as one prompt through the classifier, its one label's score. A
        truncation (truncate_prompt_tokens, or the params') cuts the pair as the tokenizer
        cuts it (vLLM's rule), not the joined prompt's start."""
        model_config = self.llm_engine.config.model_config
        assert model_config.classifier_config is not None, "score() checked the task"
        tokenizer = self.llm_engine.tokenizer
        if tokenizer is None:
            raise ValueError("a cross-encoder tokenizes its pairs; skip_tokenizer_init=False")
        if truncate_prompt_tokens is None and pooling_params is not None:
            truncate_prompt_tokens = pooling_params.truncate_prompt_tokens
        if pooling_params is not None:
            pooling_params = replace(pooling_params, truncate_prompt_tokens=None)
        max_length = truncation_size(
            as_truncate_prompt_tokens(truncate_prompt_tokens), model_config.max_model_len
        )
        pairs = []
        for p1, p2 in paired(prompts_1, prompts_2):
            text, ids = cross_encoder_prompt(
                tokenizer,
                model_config.classifier_config,
                _prompt_text(p1),
                _prompt_text(p2),
                score_template,
                max_length=max_length,
            )
            pairs.append(TokensPrompt(prompt_token_ids=ids, prompt=text))
        outputs = self.encode(
            pairs, pooling_params, use_tqdm, pooling_task="score", lora_request=lora_request
        )
        return cross_encoder_scores(outputs)

    def _run(
        self,
        prompts: list[PromptType],
        params: list,
        use_tqdm: bool,
        priorities: list[int] | None = None,
        loras: list[LoRARequest | None] | None = None,
    ) -> list:
        """Add a request per prompt (at its priority, with its LoRA adapter; None: all 0,
        none) and run the engine until each is finished; whatever stops it early (an
        error, Ctrl-C) aborts the requests it added."""
        priorities = priorities or [0] * len(prompts)
        loras = loras or [None] * len(prompts)
        with self._lock:
            ids = []
            try:
                for prompt, p, priority, lora in zip(prompts, params, priorities, loras):
                    request_id = str(next(self._request_counter))
                    self.llm_engine.add_request(
                        request_id, prompt, p, priority=priority, lora_request=lora
                    )
                    ids.append(request_id)
                return self._run_engine(ids, use_tqdm)
            finally:
                self.llm_engine.abort_request([i for i in ids if i in self.llm_engine.requests])

    def _run_engine(self, request_ids: list[str], use_tqdm: bool) -> list:
        """The finished output of each request (RequestOutput or PoolingRequestOutput).
        Ctrl-C ends it between steps (interrupts_between_steps)."""
        finished: dict[str, RequestOutput | PoolingRequestOutput] = {}
        bar = tqdm(total=len(request_ids), desc="Processed prompts", disable=not use_tqdm)
        start, in_tokens, out_tokens = time.perf_counter(), 0, 0
        with interrupts_between_steps() as interrupted:
            while self.llm_engine.has_unfinished_requests() and not interrupted():
                outputs = self.llm_engine.step()
                if self.stat_logger is not None and self.stat_logger.due():
                    self.stat_logger.log(self.llm_engine.get_stats_per_engine())
                for output in outputs:
                    if not output.finished:
                        continue
                    finished[output.request_id] = output
                    in_tokens += len(output.prompt_token_ids)
                    if isinstance(output, RequestOutput):
                        out_tokens += sum(len(c.token_ids) for c in output.outputs)
                    elapsed = time.perf_counter() - start
                    rates = f"input: {in_tokens / elapsed:.1f} tok/s, "
                    bar.set_postfix_str(rates + f"output: {out_tokens / elapsed:.1f} tok/s")
                    bar.update(1)
        bar.close()
        if interrupted():  # before a step or during the last one
            raise KeyboardInterrupt
        return [finished[i] for i in request_ids]


@contextmanager
def interrupts_between_steps() -> Iterator[Callable[[], bool]]:
    """Hold a Ctrl-C (SIGINT) until the engine's step in flight has finished: a step cut
    midway would leave tensor-parallel workers (or data-parallel replicas) waiting in the
    middle of it, out of step with rank 0 for every later call. Yields a check that says
    whether one came. A second Ctrl-C interrupts at once (a step that never finishes).
    Off the main thread, where Python delivers no signals, it changes nothing."""
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or previous == signal.SIG_IGN:
        yield lambda: False
        return
    previous = signal.default_int_handler if previous is None else previous
    received: list[int] = []

    def hold(signum: int, frame: object) -> None:
        received.append(signum)
        signal.signal(signal.SIGINT, previous)

    signal.signal(signal.SIGINT, hold)
    try:
        yield lambda: bool(received)
    finally:
        signal.signal(signal.SIGINT, previous)


def check_vllm_options(content_format: str = "auto") -> None:
    """vLLM's per-call options, accepted where they ask for nothing pagedllm lacks:
    content as strings."""
    if content_format not in ("auto", "string"):
        raise ValueError(
            f"chat_template_content_format {content_format!r}: pagedllm gives templates "
            "string content; use 'auto' or 'string'"
        )


def _with_task(params: PoolingParams, task: str) -> PoolingParams:
    """The params for `task`; params that ask for another task are refused (vLLM's rule)."""
    if params.task not in (None, task):
        raise ValueError(f"pooling params ask for task {params.task!r}; this call runs {task!r}")
    return replace(params, task=task)


def _prompt_text(prompt: PromptType) -> str:
    """A cross-encoder's side: a string, or a text prompt's `prompt`."""
    if isinstance(prompt, dict):
        if "prompt_token_ids" in prompt:
            raise TypeError(
                "a cross-encoder scores texts: its pair is tokenized as one prompt, so token "
                "ids are refused; give strings (or {'prompt': text})"
            )
        prompt = prompt.get("prompt")
    if not isinstance(prompt, str):
        raise TypeError(f"a cross-encoder scores texts: got {prompt!r}, not a string")
    return prompt


def _as_prompt_list(prompts: PromptType | Sequence[PromptType]) -> list[PromptType]:
    if isinstance(prompts, str | dict):
        return [prompts]
    prompts = list(prompts)
    if prompts and all(isinstance(p, int) for p in prompts):
        raise TypeError(
            "a list of ints is ambiguous: pass {'prompt_token_ids': [...]} for token ids"
        )
    return prompts


def _as_lora_list(
    lora_request: LoRARequest | Sequence[LoRARequest | None] | None, num_prompts: int
) -> list[LoRARequest | None]:
    """vLLM's `lora_request`: one for every prompt, or a list of one per prompt (the engine
    checks each)."""
    if lora_request is None or isinstance(lora_request, LoRARequest):
        return [lora_request] * num_prompts
    if isinstance(lora_request, str | bytes | dict) or not hasattr(lora_request, "__iter__"):
        raise TypeError(
            "lora_request must be a LoRARequest or a list of one per prompt; got "
            f"{type(lora_request).__name__}"
        )
    loras = list(lora_request)
    if len(loras) != num_prompts:
        raise ValueError(f"got {len(loras)} lora_requests for {num_prompts} prompts; give one each")
    return loras


def _indices_by_lora(loras: list[LoRARequest | None]) -> dict[LoRARequest | None, list[int]]:
    """The prompts' indices by adapter, adapters in the order they first appear."""
    groups: dict[LoRARequest | None, list[int]] = {}
    for i, lora in enumerate(loras):
        groups.setdefault(lora, []).append(i)
    return groups


def _as_priority_list(priority: Sequence[int] | None, num_prompts: int) -> list[int] | None:
    """vLLM's `priority`: one per prompt (the engine checks each value)."""
    if priority is None:
        return None
    if isinstance(priority, str | bytes) or not hasattr(priority, "__iter__"):
        raise TypeError(
            f"priority must be a list of ints, one per prompt; got {type(priority).__name__}"
        )
    priority = list(priority)
    if len(priority) != num_prompts:
        raise ValueError(f"got {len(priority)} priorities for {num_prompts} prompts; give one each")
    return priority


def _as_params_list(params: object, num_prompts: int, kind: type = SamplingParams) -> list:
    """One `kind` (SamplingParams or PoolingParams) per prompt."""
    if params is None or isinstance(params, kind):
        return [params or kind()] * num_prompts
    name = "sampling" if kind is SamplingParams else "pooling"
    if isinstance(params, str | bytes | dict) or not hasattr(params, "__iter__"):
        raise TypeError(
            f"{name} params must be a {kind.__name__} or a list of them, one per prompt; "
            f"got {type(params).__name__}"
        )
    params = list(params)
    wrong = [type(p).__name__ for p in params if not isinstance(p, kind)]
    if wrong:
        raise TypeError(f"{name} params must each be a {kind.__name__}, got {wrong[0]}")
    if len(params) != num_prompts:
        raise ValueError(
            f"got {len(params)} {name} params for {num_prompts} prompts; give one or one each"
        )
    return params


def _final_only(params: SamplingParams) -> SamplingParams:
    """generate() returns finished outputs only; don't build the intermediate ones."""
    params = params.clone()
    params.output_kind = RequestOutputKind.FINAL_ONLY
    return params
