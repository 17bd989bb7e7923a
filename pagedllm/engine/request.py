"""A request's state across steps: its sequences (n samples), text, logprobs, and the
RequestOutput it shows according to output_kind."""

import functools
import time
from concurrent.futures import Future

import torch

from pagedllm.core.sequence import Sequence
from pagedllm.engine.detokenizer import IncrementalDetokenizer
from pagedllm.engine.stats import request_metrics
from pagedllm.engine.stop_checker import StopDecision
from pagedllm.outputs import CompletionOutput, Logprob, PromptLogprobs, RequestOutput
from pagedllm.sampling_params import RequestOutputKind, SamplingParams
from pagedllm.structured_output import GrammarMatcher


class Completion:
    """One of a request's n samples: its sequence plus what the user sees of it."""

    def __init__(self, index: int, seq: Sequence, detokenizer: IncrementalDetokenizer | None):
        self.index = index
        self.seq = seq
        self.detokenizer = detokenizer
        self.text = ""
        self.logprobs: list[dict[int, Logprob]] | None = None
        self.cumulative_logprob = 0.0
        self.stop_reason: int | str | None = None
        self.sent_tokens = 0
        self.sent_text = 0

    def add_text(self, token_id: int) -> int:
        """Detokenize the new token; returns how many characters it added."""
        if self.detokenizer is None:
            return 0
        delta = self.detokenizer.add_token(token_id)
        self.text += delta
        return len(delta)

    def apply_stop(self, decision: StopDecision) -> None:
        self.stop_reason = decision.stop_reason
        if decision.truncate_text_to is not None:
            self.text = self.text[: decision.truncate_text_to]


class Request:
    def __init__(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
    ) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.params = params
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        self.first_token_time: float | None = None
        self.completions: list[Completion] = []
        self.generators: list[torch.Generator | None] = []
        # One per completion under structured_outputs, else empty; until they are set, the
        # compile that makes them (the request waits outside the scheduler meanwhile).
        self.matchers: list[GrammarMatcher] = []
        self.compiling_matchers: Future[list[GrammarMatcher]] | None = None
        self.prompt_logprobs: PromptLogprobs | None = None
        self.num_cached_tokens = 0
        self.num_sent_prompt_logprobs = 0
        self.error: Exception | None = None

    @functools.cached_property
    def reads_host_tokens(self) -> bool:
        """Whether sampling its next token reads its last output token on the host (a
        structured-output grammar; a bad word of several tokens, whose start it matches),
        so that under async scheduling it is not scheduled while that token is still being
        sampled. Penalties count such a token on the device (sample/ops/penalties.py)."""
        params = self.params
        return params.structured_outputs is not None or any(
            len(word) > 1 for word in params.bad_words_token_ids or ()
        )

    @property
    def finished(self) -> bool:
        if self.error is not None:
            return True
        if len(self.completions) < self.params.n:
            return False
        # A loop rather than all() over a generator, which costs several times more: the
        # output processor asks it of every request of every step.
        for completion in self.completions:
            if not completion.seq.is_finished:
                return False
        return True

    def make_output(self) -> RequestOutput | None:
        """The output to show now, or None (final_only and not finished)."""
        kind = self.params.output_kind
        finished = self.finished
        if kind is RequestOutputKind.FINAL_ONLY and not finished:
            return None
        delta = kind is RequestOutputKind.DELTA
        outputs = [self._completion_output(c, delta, finished) for c in self.completions]
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=self.prompt_token_ids,
            prompt_logprobs=self._prompt_logprobs_to_send(delta),
            outputs=outputs,
            finished=finished,
            num_cached_tokens=self.num_cached_tokens,
            metrics=self._metrics() if finished else {},
            error=self.error,
        )

    def _metrics(self) -> dict[str, float]:
        """The finished request's timestamps; it ends now, at its last token."""
        first_token = self.first_token_time
        return request_metrics(
            self.arrival_time,
            self.completions[0].seq.first_scheduled_time if self.completions else None,
            first_token,
            time.monotonic() if first_token is not None else None,
        )

    def _prompt_logprobs_to_send(self, delta: bool) -> PromptLogprobs | None:
        """All so far, or in delta mode those not sent yet; a copy either way, since the
        list grows while a chunked prefill goes on."""
        if self.prompt_logprobs is None:
            return None
        start = self.num_sent_prompt_logprobs if delta else 0
        self.num_sent_prompt_logprobs = len(self.prompt_logprobs)
        return self.prompt_logprobs[start:] or None

    def _completion_output(self, c: Completion, delta: bool, finished: bool) -> CompletionOutput:
        token_ids = c.seq.output_token_ids
        # Hold back text that may be the start of a stop string until the sequence ends.
        hold = 0 if c.seq.is_finished else self.params.output_text_buffer_length
        text_end = max(c.sent_text, len(c.text) - hold)
        token_start = c.sent_tokens if delta else 0
        text_start = c.sent_text if delta else 0
        c.sent_tokens, c.sent_text = len(token_ids), text_end
        logprobs = c.logprobs[token_start:] if c.logprobs is not None else None
        return CompletionOutput(
            index=c.index,
            text=c.text[text_start:text_end],
            token_ids=token_ids[token_start:],
            cumulative_logprob=c.cumulative_logprob if c.logprobs is not None else None,
            logprobs=logprobs,
            finish_reason=self._finish_reason(c),
            stop_reason=c.stop_reason,
        )

    def _finish_reason(self, c: Completion) -> str | None:
        """The sequence's, except that sequences ended by the request's failure say "error"."""
        reason = c.seq.status.finish_reason
        return "error" if self.error is not None and reason in (None, "abort") else reason
