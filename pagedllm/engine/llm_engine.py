"""LLMEngine: add_request / step / abort_request over the scheduler and the model runner."""

import itertools
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from pagedllm.config import EngineConfig
from pagedllm.engine.arg_utils import EngineArgs
from pagedllm.engine.batch import SeqChunk
from pagedllm.engine.block_manager import BlockManager
from pagedllm.engine.detokenizer import IncrementalDetokenizer
from pagedllm.engine.executor import make_executor, run_torchrun_worker, torchrun_rank
from pagedllm.engine.kv_cache import default_kv_cache_bytes
from pagedllm.engine.model_runner import StepInput, StepOutput
from pagedllm.engine.prompt_logprobs import append_prompt_logprobs
from pagedllm.engine.request import Completion, Request
from pagedllm.engine.sample_logprobs import logprobs_rows
from pagedllm.engine.scheduler import Scheduler, SchedulerOutput
from pagedllm.engine.sequence import Sequence
from pagedllm.engine.stop_checker import check_stop
from pagedllm.engine.tokenizer import generation_config_dict, get_tokenizer, model_eos_token_id
from pagedllm.logger import init_logger
from pagedllm.outputs import RequestOutput
from pagedllm.sample.metadata import SamplingRow
from pagedllm.sampling_params import SamplingParams

logger = init_logger(__name__)

PromptType = str | list[int] | dict


@dataclass
class EngineStats:
    """A snapshot for metrics. Token counts: prompt tokens of requests that got their first
    token, and every generated token (each of n completions)."""

    num_running: int
    num_waiting: int
    num_preemptions: int
    kv_cache_usage: float
    num_free_blocks: int
    num_blocks: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    num_prompt_tokens: int
    num_generation_tokens: int


class LLMEngine:
    """Under torchrun, only rank 0 becomes an engine: the other ranks follow it as
    tensor-parallel workers inside the constructor, then exit the process."""

    def __init__(self, config: EngineConfig) -> None:
        if torchrun_rank():
            run_torchrun_worker(config)
            sys.exit(0)
        self.config = config
        self.model_config = config.model_config
        torch.manual_seed(config.seed)
        self.tokenizer = None if config.skip_tokenizer_init else get_tokenizer(self.model_config)
        self.eos_token_id = model_eos_token_id(self.model_config, self.tokenizer)
        self.generation_config = generation_config_dict(self.model_config)
        self.executor = make_executor(config)
        self.num_blocks = self._num_kv_blocks()
        self.executor.init_kv_cache(self.num_blocks)
        cache = config.cache_config
        self.block_manager = BlockManager(
            self.num_blocks, cache.block_size, cache.enable_prefix_caching
        )
        sched = config.scheduler_config
        self.scheduler = Scheduler(
            sched.max_num_seqs,
            sched.max_num_batched_tokens,
            sched.enable_chunked_prefill,
            self.block_manager,
        )
        self.requests: dict[str, Request] = {}
        self._seq_ids = itertools.count()
        self.num_prompt_tokens = 0
        self.num_generation_tokens = 0

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs) -> "LLMEngine":
        return cls(engine_args.create_engine_config())

    def _num_kv_blocks(self) -> int:
        cache, block_size = self.config.cache_config, self.config.cache_config.block_size
        max_len = self.model_config.max_model_len
        per_token = self.executor.kv_cache_bytes_per_token
        num_blocks = cache.num_kv_blocks
        if num_blocks is None:
            most = self.config.scheduler_config.max_num_seqs * (max_len + block_size) * per_token
            budget = cache.kv_cache_memory_bytes or default_kv_cache_bytes(
                torch.device(self.config.device), most
            )
            num_blocks = budget // (per_token * block_size)
        if num_blocks * block_size < max_len:
            raise ValueError(
                f"the KV cache holds {num_blocks} blocks x {block_size} = "
                f"{num_blocks * block_size} tokens, fewer than max_model_len={max_len}; "
                "lower max_model_len or give more kv_cache_memory_bytes / num_kv_blocks"
            )
        gib = num_blocks * block_size * per_token / 1024**3
        logger.info(
            "KV cache: %d blocks x %d tokens = %d tokens (%.2f GiB); max concurrency at "
            "max_model_len %d: %.2fx",
            num_blocks,
            block_size,
            num_blocks * block_size,
            gib,
            max_len,
            num_blocks * block_size / max_len,
        )
        return num_blocks

    # Requests.

    def add_request(
        self,
        request_id: str,
        prompt: PromptType,
        params: SamplingParams | None = None,
        arrival_time: float | None = None,
    ) -> None:
        """Validate and queue a request; a bad one raises ValueError and changes nothing."""
        if request_id in self.requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        params = self._prepare_params(params)
        text, token_ids = self._tokenize(prompt)
        self._check_fits_cache(len(token_ids), params)
        request = Request(request_id, text, token_ids, params, arrival_time)
        seq = Sequence(
            next(self._seq_ids), token_ids, self.config.cache_config.block_size, params, request_id
        )
        seq.skip_prefix_cache = params.prompt_logprobs is not None
        request.completions.append(Completion(0, seq, self._detokenizer(token_ids, params)))
        request.generators = [self._generator(params, k) for k in range(params.n)]
        self.scheduler.add_seq(seq)
        self.requests[request_id] = request

    def _prepare_params(self, params: SamplingParams | None) -> SamplingParams:
        params = SamplingParams() if params is None else params.clone()
        if not isinstance(params, SamplingParams):
            raise TypeError(f"sampling params must be SamplingParams, got {type(params)}")
        params.update_from_generation_config(self.generation_config, self.eos_token_id)
        if self.tokenizer is not None:
            params.update_from_tokenizer(self.tokenizer)
        params.verify(self.model_config.vocab_size, self.config.max_logprobs, self.config.max_n)
        self.executor.runner.sampler.logitsprocs.validate_params(params)
        return params

    def _tokenize(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        text, token_ids = None, None
        if isinstance(prompt, dict):
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
            if self.tokenizer is None:
                raise ValueError("text prompts need a tokenizer (skip_tokenizer_init is set)")
            token_ids = self.tokenizer.encode(text)
        self._check_prompt_ids(token_ids)
        return text, token_ids

    def _check_prompt_ids(self, token_ids: list[int]) -> None:
        vocab, max_len = self.model_config.vocab_size, self.model_config.max_model_len
        if not token_ids:
            raise ValueError("the prompt is empty (0 tokens); give at least 1 token")
        bad = [t for t in token_ids if not isinstance(t, int) or not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {vocab})")
        if len(token_ids) > max_len:
            raise ValueError(
                f"the prompt has {len(token_ids)} tokens, more than max_model_len={max_len}"
            )

    def _check_fits_cache(self, num_prompt_tokens: int, params: SamplingParams) -> None:
        """Bound the fan-out: n completions of up to max_tokens each (None: up to
        max_model_len) may produce no more tokens than the whole KV cache holds. (Each one
        alone always fits: the cache holds max_model_len; the scheduler runs them in turn.)"""
        max_len = self.model_config.max_model_len
        max_new = max_len - num_prompt_tokens
        if params.max_tokens is not None:
            max_new = min(max_new, params.max_tokens)
        capacity = self.num_blocks * self.config.cache_config.block_size
        if params.n * max_new > capacity:
            raise ValueError(
                f"n={params.n} completions of up to {max_new} tokens each may generate "
                f"{params.n * max_new} tokens, more than the KV cache holds ({capacity} "
                "tokens); lower n or max_tokens"
            )

    def _detokenizer(
        self, prompt_ids: list[int], params: SamplingParams
    ) -> IncrementalDetokenizer | None:
        if self.tokenizer is None or not params.detokenize:
            return None
        return IncrementalDetokenizer(
            self.tokenizer,
            prompt_ids,
            params.skip_special_tokens,
            params.spaces_between_special_tokens,
        )

    def _generator(self, params: SamplingParams, index: int) -> torch.Generator | None:
        if params.seed is None:
            return None
        return torch.Generator(self.config.device).manual_seed(params.seed + index)

    def abort_request(self, request_id: str | Iterable[str]) -> None:
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        for rid in ids:
            if self.requests.pop(rid, None) is not None:
                self.scheduler.abort_seq(rid)

    def is_healthy(self) -> bool:
        """False once the executor cannot run steps any more (a tensor-parallel worker died)."""
        return self.executor.is_healthy()

    def shutdown(self) -> None:
        """Stop tensor-parallel workers; the engine is unusable afterwards."""
        self.executor.shutdown()

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def get_num_unfinished_requests(self) -> int:
        return len(self.requests)

    def get_stats(self) -> EngineStats:
        """The current load, and counters since the engine started."""
        blocks, scheduler = self.block_manager, self.scheduler
        return EngineStats(
            num_running=scheduler.num_running,
            num_waiting=scheduler.num_waiting,
            num_preemptions=scheduler.num_preemptions,
            kv_cache_usage=blocks.usage,
            num_free_blocks=blocks.num_free_blocks,
            num_blocks=blocks.num_blocks,
            prefix_cache_queries=blocks.prefix_cache_queries,
            prefix_cache_hits=blocks.prefix_cache_hits,
            num_prompt_tokens=self.num_prompt_tokens,
            num_generation_tokens=self.num_generation_tokens,
        )

    # Steps.

    def step(self) -> list[RequestOutput]:
        out = self.scheduler.schedule()
        if out.is_empty:
            return []
        step_input, rows, row_owners = self._build_step(out)
        result = self.executor.execute(step_input, rows)
        self.scheduler.update_after_step(out.scheduled)
        touched = self._process_prompt_logprobs(out, result)
        touched |= self._process_samples(out, result, row_owners)
        return self._collect_outputs(touched)

    def _build_step(
        self, out: SchedulerOutput
    ) -> tuple[StepInput, list[SamplingRow], list[tuple[int, int]]]:
        """Chunks for every scheduled sequence; sampler rows (a request's first token is
        sampled n times from its parent's logits) with (batch index, completion index)."""
        chunks, sample_indices, prompt_indices = [], [], []
        rows, owners = [], []
        for i, s in enumerate(out.scheduled):
            seq, start = s.seq, s.seq.num_computed_tokens
            new_tokens = seq.token_ids[start : start + s.num_new_tokens]
            chunks.append(SeqChunk(new_tokens, start, seq.block_table))
            request = self.requests[seq.request_id]
            if request.params.prompt_logprobs is not None and start < seq.num_prompt_tokens:
                prompt_indices.append(i)
            if not s.produces_token:
                continue
            indices = self._completion_indices(request, seq)
            prompt_ids, output_ids = seq.token_ids[: seq.num_prompt_tokens], seq.output_token_ids
            for k in indices:
                generator = request.generators[k]
                rows.append(SamplingRow(request.params, prompt_ids, output_ids, generator))
                sample_indices.append(i)
                owners.append((i, k))
        step = StepInput(chunks, out.blocks_to_copy, sample_indices, prompt_indices)
        return step, rows, owners

    @staticmethod
    def _completion_indices(request: Request, seq: Sequence) -> list[int]:
        """Which completions this sequence's token feeds: all n at the first token."""
        if len(request.completions) < request.params.n:
            return list(range(request.params.n))
        return [next(c.index for c in request.completions if c.seq is seq)]

    def _process_prompt_logprobs(self, out: SchedulerOutput, result: StepOutput) -> set[str]:
        touched = set()
        for i, logits in result.prompt_logits.items():
            s = out.scheduled[i]
            request = self.requests[s.seq.request_id]
            start = s.seq.num_computed_tokens - s.num_new_tokens
            try:
                append_prompt_logprobs(request, logits, start, self.tokenizer)
            except Exception as e:  # noqa: BLE001 - this request's failure, not the batch's
                self._fail_request(request, e)
            touched.add(request.request_id)
        return touched

    def _process_samples(
        self, out: SchedulerOutput, result: StepOutput, owners: list[tuple[int, int]]
    ) -> set[str]:
        if result.sampler_output is None:
            return set()
        sampler_output = result.sampler_output
        requests = [self.requests[out.scheduled[i].seq.request_id] for i, _ in owners]
        tokens = sampler_output.sampled_token_ids.tolist()
        num_logprobs = [r.params.logprobs for r in requests]
        logprobs = logprobs_rows(sampler_output.logprobs, num_logprobs, self.tokenizer)
        rows = zip(requests, owners, tokens, logprobs)
        for row, (request, (_, k), token, lp) in enumerate(rows):
            if request.error is not None:
                continue
            try:
                if row in sampler_output.errors:
                    raise sampler_output.errors[row]
                if len(request.completions) < request.params.n:
                    self._fork_completions(request)
                self._append_token(request, request.completions[k], token, lp)
            except Exception as e:  # noqa: BLE001 - this request's failure, not the batch's
                self._fail_request(request, e)
        return {r.request_id for r in requests}

    def _fail_request(self, request: Request, error: Exception) -> None:
        """End `request` with `error` (its output says so); the batch goes on."""
        logger.warning("request %s failed: %r", request.request_id, error)
        request.error = error
        self.scheduler.abort_seq(request.request_id)

    def _fork_completions(self, request: Request) -> None:
        """Completions 1..n-1 start as copies of the parent, sharing its KV blocks."""
        parent = request.completions[0].seq
        for k in range(1, request.params.n):
            child = Sequence(
                next(self._seq_ids),
                parent.token_ids,
                self.config.cache_config.block_size,
                request.params,
                request.request_id,
            )
            self.scheduler.fork_seq(parent, child)
            detokenizer = self._detokenizer(request.prompt_token_ids, request.params)
            request.completions.append(Completion(k, child, detokenizer))

    def _append_token(
        self, request: Request, completion: Completion, token: int, logprobs: dict | None
    ) -> None:
        seq, params = completion.seq, request.params
        seq.append_token(token)
        self.num_generation_tokens += 1
        if request.first_token_time is None:
            request.first_token_time = time.monotonic()
            request.num_cached_tokens = request.completions[0].seq.num_cached_tokens
            self.num_prompt_tokens += len(request.prompt_token_ids)
        if logprobs is not None:
            completion.logprobs = (completion.logprobs or []) + [logprobs]
            completion.cumulative_logprob += logprobs[token].logprob
        new_chars = completion.add_text(token)
        max_len = self.model_config.max_model_len
        decision = check_stop(seq, params, self.eos_token_id, max_len, completion.text, new_chars)
        if decision is not None:
            completion.apply_stop(decision)
            self.scheduler.finish_seq(seq, decision.status)

    def _collect_outputs(self, touched: set[str]) -> list[RequestOutput]:
        outputs = []
        for rid in touched:
            request = self.requests[rid]
            output = request.make_output()
            if output is not None:
                outputs.append(output)
            if request.finished:
                del self.requests[rid]
        return outputs
