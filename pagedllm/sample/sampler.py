"""The sampling pipeline: logits [B, V] -> one token per row, plus the logprobs asked for.

Order (vLLM v1): structured-output bitmask (constrained rows) -> raw logprobs (raw modes)
-> float32 (skipped when the batch only takes an argmax: `argmax_only`, no custom
processors; a bf16 row's argmax is its float32 one) -> allowed_token_ids mask -> bad
words -> non-argmax-invariant processors (min_tokens, logit_bias, custom) -> penalties ->
greedy rows: argmax; random rows: temperature -> argmax-invariant processors (min_p,
custom) -> top-k / top-p -> sample -> gather logprobs (processed modes: the final logits).

Logits processors keep per-row state; see pagedllm/sample/logits_processors.py for how the
Sampler keeps them in step with the batch.

Off the CPU the sampler never makes the host wait for the device until its end: the rows
that cannot sample are found on the device, and the sampled ids, those rows and the
logprobs come back to the host in one batch of copies and one wait (device_copy.to_host);
its SamplerOutput then holds host tensors. `launch` stops before that wait: its
PendingSamplerOutput keeps the sampled ids on the device, for the next step to read
before this one's result is on the host (async scheduling), and waits in `result()`.
"""

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, get_args

import torch
from torch import nn

from pagedllm import _custom_ops
from pagedllm.device_copy import copy_to_host
from pagedllm.sample.logits_processors import (
    BatchUpdate,
    LogitsProcessor,
    build_logitsprocs,
)
from pagedllm.sample.metadata import SamplingMetadata
from pagedllm.sample.ops.bad_words import apply_bad_words
from pagedllm.sample.ops.logprobs import LogprobsTensors, compute_logprobs, gather_logprobs
from pagedllm.sample.ops.penalties import apply_penalties
from pagedllm.sample.ops.row_chunks import row_chunks
from pagedllm.sample.ops.token_bitmask import apply_token_bitmask
from pagedllm.sample.ops.top_k_top_p import apply_top_k_top_p, apply_top_k_top_p_sorted

LogprobsMode = Literal["raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits"]


@dataclass
class SamplerOutput:
    """`errors` maps the rows that could not sample (their request fails, the others go
    on) to why; their entry in sampled_token_ids is a placeholder 0."""

    sampled_token_ids: torch.Tensor  # [B] int64
    logprobs: LogprobsTensors | None  # None when no row asked for logprobs
    errors: dict[int, Exception] = field(default_factory=dict)


class PendingSamplerOutput:
    """A step's SamplerOutput on its way to the host: `sampled_on_device` now, the output
    from `result()`, which waits for the device (once; later calls return it again)."""

    def __init__(self, sampled_on_device: torch.Tensor, finish: Callable[[], SamplerOutput]):
        self.sampled_on_device = sampled_on_device
        self._finish: Callable[[], SamplerOutput] | None = finish
        self._output: SamplerOutput | None = None

    @classmethod
    def ready(
        cls, output: SamplerOutput, device: torch.device | None = None
    ) -> "PendingSamplerOutput":
        """An output already on the host (the CPU's, or a slow path's); `device`: where the
        next step reads the sampled ids (its placeholders, a tensor-parallel broadcast),
        given where that is not the host."""
        on_device = output.sampled_token_ids
        if device is not None:
            on_device = on_device.to(device)
        return cls(on_device, lambda: output)

    def result(self) -> SamplerOutput:
        if self._finish is not None:
            self._output, self._finish = self._finish(), None
        return self._output


class Sampler(nn.Module):
    """Samples one token per row. `forward` may modify the logits it is given in place."""

    def __init__(
        self,
        vocab_size: int,
        device: torch.device | str = "cpu",
        logprobs_mode: LogprobsMode = "raw_logprobs",
        logits_processors: Sequence[type[LogitsProcessor] | str] = (),
    ) -> None:
        super().__init__()
        if logprobs_mode not in get_args(LogprobsMode):
            raise ValueError(
                f"logprobs_mode must be one of {get_args(LogprobsMode)}, got {logprobs_mode!r}"
            )
        self.logprobs_mode = logprobs_mode
        self.vocab_size = vocab_size
        self.device = torch.device(device)
        self.logitsprocs = build_logitsprocs(vocab_size, self.device, custom=logits_processors)
        self.has_custom_processors = bool(logits_processors)
        self._row_outputs: list[list[int] | None] = []  # the rows the processors hold, see below
        self._float32_logits = torch.empty(0, device=self.device)  # see _as_float32
        # The module docstring's one wait for the step; on the CPU reading the result costs
        # nothing, and the host-side check of the chosen logits is the fastest there.
        self.sync_free = self.device.type != "cpu"

    def forward(self, logits: torch.Tensor, metadata: SamplingMetadata) -> SamplerOutput:
        """logits [B, V] -> SamplerOutput with sampled_token_ids [B]."""
        return self.launch(logits, metadata).result()

    def launch(self, logits: torch.Tensor, metadata: SamplingMetadata) -> PendingSamplerOutput:
        """`forward` without its wait for the device.

        Custom processors are user code that may fail for one request's arguments: if the
        batch fails with them, each row is sampled alone from a saved copy of the logits,
        so only the rows that fail alone get an error.
        """
        saved = None
        if self.has_custom_processors and len(metadata.rows) > 1:
            saved = logits.clone()
        try:
            return self._sample_batch(logits, metadata)
        except Exception:
            if saved is None:
                raise
            alone = self._sample_rows_alone(saved, metadata)  # on the host off the CPU
            return PendingSamplerOutput.ready(alone, self.device)

    def _sample_batch(
        self, logits: torch.Tensor, metadata: SamplingMetadata
    ) -> PendingSamplerOutput:
        self._refresh_logitsprocs(metadata)
        if metadata.token_bitmask is not None:
            apply_token_bitmask(logits, metadata.token_bitmask_rows, metadata.token_bitmask)
        num_logprobs = metadata.max_num_logprobs
        raw = None
        if num_logprobs is not None and self.logprobs_mode == "raw_logprobs":
            raw = compute_logprobs(logits)
        elif num_logprobs is not None and self.logprobs_mode == "raw_logits":
            raw = logits.to(torch.float32, copy=True)
        if not (metadata.argmax_only and not self.has_custom_processors):
            logits = self.apply_logits_processors(self._as_float32(logits), metadata)
        sampled, final_logits = self.sample(logits, metadata)
        if self.sync_free:
            sampled, sampleable = _mask_unsampleable(sampled, final_logits)
        else:
            sampled, errors = _reject_unsampleable(sampled, final_logits)
        processed = self._processed(final_logits, metadata)
        logprobs = None
        if num_logprobs is not None:
            reported = raw if processed is None else processed
            logprobs = gather_logprobs(reported, num_logprobs, sampled)
        if self.sync_free:
            return _to_host_output(sampled, sampleable, logprobs)
        return PendingSamplerOutput.ready(SamplerOutput(sampled, logprobs, errors))

    def _as_float32(self, logits: torch.Tensor) -> torch.Tensor:
        """logits in float32; other dtypes are converted into a buffer kept across steps:
        a new one (50 MB at 256 rows of a 49k vocabulary) is above glibc's largest mmap
        threshold, so every step would fault its pages in again. Nothing returned from a
        step refers to it (logprobs are gathered into new tensors)."""
        if logits.dtype is torch.float32:
            return logits
        if self._float32_logits.numel() < logits.numel():
            self._float32_logits = torch.empty(logits.numel(), device=self.device)
        return self._float32_logits[: logits.numel()].view(logits.shape).copy_(logits)

    def _sample_rows_alone(self, logits: torch.Tensor, metadata: SamplingMetadata) -> SamplerOutput:
        """Each row as a batch of one, with the batch's logprobs count so the rows stack."""
        outputs, errors = [], {}
        for i, row in enumerate(metadata.rows):
            alone = SamplingMetadata.build([row], self.vocab_size, self.device)
            alone.max_num_logprobs = metadata.max_num_logprobs
            try:
                outputs.append(self._sample_batch(logits[i : i + 1].clone(), alone).result())
            except Exception as e:  # noqa: BLE001 - the row's own failure, reported to it
                errors[i] = e
                outputs.append(self._placeholder(logits[i : i + 1], alone))
            if outputs[-1].errors:
                errors[i] = outputs[-1].errors[0]
        sampled = torch.cat([o.sampled_token_ids for o in outputs])
        if metadata.max_num_logprobs is None:
            return SamplerOutput(sampled, None, errors)
        parts = [o.logprobs for o in outputs]
        logprobs = LogprobsTensors(*(torch.cat(tensors) for tensors in zip(*parts)))
        return SamplerOutput(sampled, logprobs, errors)

    def _placeholder(self, logits: torch.Tensor, metadata: SamplingMetadata) -> SamplerOutput:
        """Token 0 with logprobs of the right shape, for a row that failed (where the other
        rows' outputs are)."""
        sampled = torch.zeros(1, dtype=torch.long, device=logits.device)
        logprobs = None
        if metadata.max_num_logprobs is not None:
            zeros = torch.zeros_like(logits, dtype=torch.float32)
            logprobs = gather_logprobs(zeros, metadata.max_num_logprobs, sampled)
        if self.sync_free:
            sampleable = torch.ones_like(sampled, dtype=torch.bool)
            return _to_host_output(sampled, sampleable, logprobs).result()
        return SamplerOutput(sampled, logprobs)

    def _refresh_logitsprocs(self, metadata: SamplingMetadata) -> None:
        """Tell every processor the whole batch: each row added at its index, rows past the
        new batch size removed; or None when the rows are those of the last call, in the
        same order (the contract of logits_processors.py). A row is known by its output
        list, its sequence's own (held here, so that no new list takes its id)."""
        outputs, num_rows = [row.output_token_ids for row in metadata.rows], len(metadata.rows)
        last, held = self._row_outputs, len(self._row_outputs)
        # Until every processor has taken the update, rows no batch matches (a refresh
        # next time), as many as either batch may have left.
        self._row_outputs = [None] * max(held, num_rows)
        update = None
        if len(outputs) != len(last) or any(a is not b for a, b in zip(outputs, last)):
            update = BatchUpdate(
                batch_size=num_rows,
                removed=list(range(num_rows, held)),
                added=[
                    (i, row.params, row.prompt_token_ids, row.output_token_ids)
                    for i, row in enumerate(metadata.rows)
                ],
                moved=[],
            )
        for processor in self.logitsprocs.all:
            processor.update_state(update)
        self._row_outputs = outputs

    def apply_logits_processors(
        self, logits: torch.Tensor, metadata: SamplingMetadata
    ) -> torch.Tensor:
        """Everything that may change the argmax: masks, bad words, processors, penalties."""
        if metadata.allowed_token_ids_mask is not None:
            logits.masked_fill_(metadata.allowed_token_ids_mask, float("-inf"))
        if metadata.bad_words_token_ids:
            apply_bad_words(logits, metadata.bad_words_token_ids, metadata.output_token_ids)
        for processor in self.logitsprocs.non_argmax_invariant:
            logits = processor.apply(logits)
        if not metadata.no_penalties:
            logits = apply_penalties(
                logits,
                metadata.seen_token_counts,
                metadata.output_token_counts,
                metadata.presence_penalties,
                metadata.frequency_penalties,
                metadata.repetition_penalties,
                metadata.pending_tokens,
            )
        return logits

    def sample(
        self, logits: torch.Tensor, metadata: SamplingMetadata
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (sampled [B] int64, the final logits [B, V] the tokens were drawn from)."""
        greedy = None if metadata.all_random else _custom_ops.argmax(logits)
        if metadata.all_greedy:
            return greedy, logits
        logits.div_(metadata.temperature.unsqueeze(1))
        for processor in self.logitsprocs.argmax_invariant:
            logits = processor.apply(logits)
        top_k_top_p = apply_top_k_top_p_sorted if self.sync_free else apply_top_k_top_p
        logits = top_k_top_p(logits, metadata.top_k, metadata.top_p)
        sampled = random_sample(logits, metadata.generators)
        if greedy is not None:
            sampled = torch.where(metadata.greedy_mask, greedy, sampled)
        return sampled, logits

    def _processed(self, logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor | None:
        """Processed logprobs or logits [B, V] if a processed mode and some row asked for
        logprobs, else None."""
        if metadata.max_num_logprobs is None or not self.logprobs_mode.startswith("processed"):
            return None
        if self.logprobs_mode == "processed_logprobs":
            return compute_logprobs(logits)
        return logits  # not modified after this point


_UNSAMPLEABLE = (
    "no token can be sampled for this request: after structured_outputs, "
    "allowed_token_ids, bad_words, logit_bias, min_tokens, penalties and temperature "
    "every logit is -inf or NaN"
)


def _reject_unsampleable(
    sampled: torch.Tensor, logits: torch.Tensor
) -> tuple[torch.Tensor, dict[int, Exception]]:
    """Rows whose token is no real choice (its logit -inf or NaN, or out of range: every
    token was masked, or the request's parameters overflowed float32) -> their errors, and
    the tokens with 0 in their place. O(B): one gathered logit per row, checked in Python
    (a handful of tensor ops a step, which at batch 1 cost more than the check itself)."""
    vocab_size = logits.shape[1]
    index = sampled.clamp(0, vocab_size - 1).unsqueeze(1)
    chosen = logits.gather(1, index).squeeze(1).tolist()
    rows = [
        i
        for i, (token, logit) in enumerate(zip(sampled.tolist(), chosen, strict=True))
        if not (0 <= token < vocab_size and logit > -math.inf)  # False for NaN too
    ]
    if not rows:
        return sampled, {}
    sampled = sampled.clone()
    sampled[rows] = 0
    return sampled, {row: ValueError(_UNSAMPLEABLE) for row in rows}


def _mask_unsampleable(
    sampled: torch.Tensor, logits: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """_reject_unsampleable on the device: (the tokens with 0 where no real choice was made,
    which rows made one [B] bool), nothing read on the host."""
    vocab_size = logits.shape[1]
    chosen = logits.gather(1, sampled.clamp(0, vocab_size - 1).unsqueeze(1)).squeeze(1)
    sampleable = (sampled >= 0) & (sampled < vocab_size) & (chosen > -math.inf)  # NaN: False
    return torch.where(sampleable, sampled, torch.zeros_like(sampled)), sampleable


def _to_host_output(
    sampled: torch.Tensor, sampleable: torch.Tensor, logprobs: LogprobsTensors | None
) -> PendingSamplerOutput:
    """The step's one device-to-host transfer: the sampled ids, which rows could sample and
    the logprobs, copied together; once they are on the host, the errors are found there."""
    copies = copy_to_host([sampled, sampleable, *(logprobs or ())])

    def finish() -> SamplerOutput:
        host_sampled, host_sampleable, *gathered = copies.wait()
        rows = (~host_sampleable).nonzero().flatten().tolist()
        errors: dict[int, Exception] = {row: ValueError(_UNSAMPLEABLE) for row in rows}
        logprobs = LogprobsTensors(*gathered) if gathered else None
        return SamplerOutput(host_sampled, logprobs, errors)

    return PendingSamplerOutput(sampled, finish)


def random_sample(logits: torch.Tensor, generators: dict[int, torch.Generator]) -> torch.Tensor:
    """logits [B, V] -> [B] int64, one draw per row from softmax(logits).

    Inverts each row's cumulative distribution at one uniform draw: V times fewer random
    numbers than vLLM's exponential race, which dominates sampling time on a CPU (~200 ms
    for 64 rows of 152k tokens). The CDF is float64 so even flat rows of a large vocabulary
    keep each token's share exact. Seeded rows draw from their own generator, so their
    token does not depend on the other rows. Since u < 1, u * total < total and the first
    CDF entry above it belongs to a token of nonzero probability. A few rows at a time
    (ops/row_chunks.py): the whole batch's CDF is 100 MB for 256 rows of a 49k vocabulary.
    """
    u = torch.rand(logits.shape[0], 1, dtype=torch.float64, device=logits.device)
    for row, generator in generators.items():
        u[row] = torch.rand(1, dtype=torch.float64, device=logits.device, generator=generator)
    sampled = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)
    for rows in row_chunks(logits.shape[0]):
        weights = (logits[rows] - logits[rows].amax(dim=-1, keepdim=True)).exp_()
        cdf = weights.cumsum(dim=-1, dtype=torch.float64)
        sampled[rows] = torch.searchsorted(cdf, u[rows] * cdf[:, -1:], right=True).squeeze(1)
    return sampled
