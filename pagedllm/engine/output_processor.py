"""OutputProcessor: a step's results -> each request's completions and RequestOutputs.

It owns the requests in flight. Per sampled token: fork the n completions at a request's
first token (sharing the parent's KV blocks), advance the completion's structured-output
matcher, append, detokenize incrementally, turn the logprob tensors into dicts, check the
stop conditions (a completed constraint stops with "stop") and finish sequences in the
scheduler; per prefill chunk with prompt_logprobs: extend them. A sequence that verified
draft tokens (speculative decoding) appends the tokens its rows accept
(spec_decode/rejection_sampler.py) one at a time, each checked for stops, those after a
stop dropped. A failure that belongs to
one request (no token could be sampled under its parameters, its detokenization or stop
check raising) ends that request alone with `RequestOutput.error`; the batch goes on.
A pooling request's chunks add to its pooling; its last chunk finishes it (its blocks
are freed at once: no KV outlives the request).
"""

import logging
import time
import traceback

from transformers import PreTrainedTokenizerBase

from pagedllm.core.scheduler import Scheduler, SchedulerOutput
from pagedllm.core.sequence import Sequence, SequenceStatus, new_seq_id
from pagedllm.engine.detokenizer import make_detokenizer
from pagedllm.engine.logprobs import append_prompt_logprobs, logprobs_rows
from pagedllm.engine.pooling_request import PoolingRequest
from pagedllm.engine.request import Completion, Request
from pagedllm.engine.stats import SpecDecodingStats
from pagedllm.engine.stop_checker import check_stop, token_stop
from pagedllm.executor.model_runner import StepOutput
from pagedllm.layers.classifier import SequenceClassifier
from pagedllm.layers.st_projector import StProjector
from pagedllm.logger import init_logger
from pagedllm.outputs import Logprob, PoolingRequestOutput, RequestOutput
from pagedllm.pooler_config import PoolerConfig
from pagedllm.spec_decode.rejection_sampler import accepted_tokens

logger = init_logger(__name__)


class OutputProcessor:
    def __init__(
        self,
        scheduler: Scheduler,
        tokenizer: PreTrainedTokenizerBase | None,
        eos_token_id: int | None,
        max_model_len: int,
        pooler_config: PoolerConfig | None = None,
        projector: StProjector | None = None,
        classifier: SequenceClassifier | None = None,
    ) -> None:
        """`pooler_config`: a pooling model's (None when it generates); `projector`: its
        sentence-transformers Dense modules, where it has any; `classifier`: a classifier's
        score head."""
        self.scheduler = scheduler
        self.pooler_config = pooler_config
        self.projector = projector
        self.classifier = classifier
        self.tokenizer = tokenizer
        self.eos_token_id = eos_token_id
        self.max_model_len = max_model_len
        self.requests: dict[str, Request | PoolingRequest] = {}
        self.num_prompt_tokens = 0  # of requests that got their first token
        self.num_generation_tokens = 0  # every generated token, of every completion
        self.spec_decoding = SpecDecodingStats()

    def process(
        self, out: SchedulerOutput, result: StepOutput, owners: list[tuple[int, int]]
    ) -> list[RequestOutput | PoolingRequestOutput]:
        """The outputs of the requests this step touched; finished ones are forgotten.
        Sequences that ended while their batch was in flight (aborted under pipeline
        parallelism; stopped a step before, under async scheduling) are skipped."""
        stale = {i for i, s in enumerate(out.scheduled) if s.seq.status.is_finished}
        touched = self._process_prompt_logprobs(out, result, stale)
        touched |= self._process_samples(out, result, owners, stale)
        touched |= self._process_pooled(out, result, stale)
        outputs = []
        for request_id in touched:
            output = self.requests[request_id].make_output()
            if output is None:  # final_only and not finished
                continue
            outputs.append(output)
            if output.finished:
                del self.requests[request_id]
        return outputs

    def _process_prompt_logprobs(
        self, out: SchedulerOutput, result: StepOutput, stale: set[int]
    ) -> set[str]:
        touched = set()
        for i, logits in result.prompt_logits.items():
            if i in stale:
                continue
            s = out.scheduled[i]
            request = self.requests[s.seq.request_id]
            try:
                append_prompt_logprobs(request, logits, s.start, self.tokenizer)
            except Exception as e:  # noqa: BLE001 - this request's failure, not the batch's
                self._fail_request(request, e)
            touched.add(request.request_id)
        return touched

    def _process_pooled(
        self, out: SchedulerOutput, result: StepOutput, stale: set[int]
    ) -> set[str]:
        """Add each pooled chunk to its request; a prompt's last chunk finishes it."""
        if self.pooler_config is None:
            return set()
        touched = set()
        for i, s in enumerate(out.scheduled):
            if i in stale:
                continue
            request = self.requests[s.seq.request_id]
            if not isinstance(request, PoolingRequest):
                continue
            if i in result.pooled:
                request.add_chunk(result.pooled[i], s.start, self.pooler_config.pooling_type)
            if s.produces_token:
                request.finish(self.pooler_config, self.projector, self.classifier)
                self.num_prompt_tokens += len(request.prompt_token_ids)
                self.scheduler.finish_seq(s.seq, SequenceStatus.FINISHED_STOPPED)
                touched.add(request.request_id)
        return touched

    def _process_samples(
        self,
        out: SchedulerOutput,
        result: StepOutput,
        owners: list[tuple[int, int]],
        stale: set[int],
    ) -> set[str]:
        sampler_output = result.sampler_output
        if sampler_output is None:
            return set()
        requests = [
            None if i in stale else self.requests[out.scheduled[i].seq.request_id]
            for i, _ in owners
        ]
        tokens = sampler_output.sampled_token_ids.tolist()
        num_logprobs = [None if r is None else r.params.logprobs for r in requests]
        logprobs = logprobs_rows(sampler_output.logprobs, num_logprobs, self.tokenizer)
        rows = zip(requests, owners, tokens, logprobs)
        next_row = 0  # past the rows verifying the drafts of the last sequence
        for row, (request, (i, k), token, lp) in enumerate(rows):
            if row < next_row or request is None or request.error is not None:
                continue
            drafts = out.scheduled[i].draft_token_ids
            next_row = row + len(drafts) + 1
            try:
                for r in range(row, next_row):
                    if r in sampler_output.errors:
                        raise sampler_output.errors[r]
                if len(request.completions) < request.params.n:
                    self._fork_completions(request)
                if drafts:
                    self._append_verified(
                        request, request.completions[k], tokens[row:next_row], drafts
                    )
                else:
                    self._append_token(request, request.completions[k], token, lp)
            except Exception as e:  # noqa: BLE001 - this request's failure, not the batch's
                self._fail_request(request, e)
        return {r.request_id for r in requests if r is not None}

    def _append_verified(
        self, request: Request, completion: Completion, sampled: list[int], drafts: list[int]
    ) -> None:
        """Append the tokens `sampled` (the rows of the sequence's last token and drafts)
        accept, up to a stop; the accepted drafts' KV then counts as computed."""
        accepted = accepted_tokens(sampled, drafts)
        self.spec_decoding.observe(len(drafts), len(accepted) - 1)
        seq = completion.seq
        for token in accepted:
            self._append_token(request, completion, token, None)
            if seq.is_finished:
                return
        self.scheduler.accept_draft_tokens(seq, len(accepted) - 1)

    def _fork_completions(self, request: Request) -> None:
        """Completions 1..n-1 start as copies of the parent, sharing its KV blocks."""
        parent = request.completions[0].seq
        for k in range(1, request.params.n):
            child = Sequence(
                new_seq_id(),
                parent.token_ids,
                parent.block_size,
                request.params,
                request.request_id,
                parent.arrival_time,
                parent.priority,
                parent.cache_salt,
                parent.lora,
            )
            self.scheduler.fork_seq(parent, child)
            detokenizer = make_detokenizer(self.tokenizer, request.prompt_token_ids, request.params)
            request.completions.append(Completion(k, child, detokenizer))

    def _append_token(
        self,
        request: Request,
        completion: Completion,
        token: int,
        logprobs: dict[int, Logprob] | None,
    ) -> None:
        seq, params = completion.seq, request.params
        matcher = request.matchers[completion.index] if request.matchers else None
        if matcher is not None:
            matcher.accept_token(token)
        seq.append_token(token)
        self.num_generation_tokens += 1
        if request.first_token_time is None:
            request.first_token_time = time.monotonic()
            request.num_cached_tokens = request.completions[0].seq.num_cached_tokens
            self.num_prompt_tokens += len(request.prompt_token_ids)
        if logprobs is not None:
            if completion.logprobs is None:
                completion.logprobs = []
            completion.logprobs.append(logprobs)  # outputs get slices of it, never the list
            completion.cumulative_logprob += logprobs[token].logprob
        new_chars = 0
        if params.include_stop_str_in_output or token_stop(seq, params, self.eos_token_id) is None:
            new_chars = completion.add_text(token)
        terminated = matcher is not None and matcher.is_terminated
        decision = check_stop(
            seq,
            params,
            self.eos_token_id,
            self.max_model_len,
            completion.text,
            new_chars,
            terminated,
        )
        if decision is not None:
            completion.apply_stop(decision)
            self.scheduler.finish_seq(seq, decision.status)

    def _fail_request(self, request: Request, error: Exception) -> None:
        """End `request` with `error` (its output says so); the batch goes on.

        The error is kept without its traceback, which is logged at debug level: the frames
        it raised through hold this processor and the batch's requests, so through
        `request.error` they would form a reference cycle holding the whole engine (model
        and cache) until Python's cyclic collector ran."""
        logger.warning("request %s failed: %r", request.request_id, error)
        if logger.isEnabledFor(logging.DEBUG):
            where = "".join(traceback.format_tb(error.__traceback__))
            logger.debug("request %s failed at:\n%s", request.request_id, where)
        request.error = error.with_traceback(None)
        self.scheduler.abort_seq(request.request_id)
