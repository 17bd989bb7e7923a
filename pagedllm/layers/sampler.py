"""The sampling pipeline: logits [B, V] -> one token per row, plus the logprobs asked for.

Order (vLLM v1): raw logprobs (raw modes) -> float32 -> allowed_token_ids mask -> bad
words -> non-argmax-invariant processors (min_tokens, logit_bias, custom) -> penalties ->
greedy rows: argmax; random rows: temperature -> argmax-invariant processors (min_p,
custom) -> top-k / top-p -> sample -> gather logprobs (processed modes: the final logits).

Logits processors keep per-row state; see pagedllm/sample/logits_processors.py for how the
Sampler keeps them in step with the batch.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import torch
from torch import nn

from pagedllm.sample.logits_processors import (
    BatchUpdate,
    LogitsProcessor,
    build_logitsprocs,
)
from pagedllm.sample.metadata import SamplingMetadata
from pagedllm.sample.ops.bad_words import apply_bad_words
from pagedllm.sample.ops.logprobs import LogprobsTensors, compute_logprobs, gather_logprobs
from pagedllm.sample.ops.penalties import apply_penalties
from pagedllm.sample.ops.top_k_top_p import apply_top_k_top_p

LogprobsMode = Literal["raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits"]


@dataclass
class SamplerOutput:
    sampled_token_ids: torch.Tensor  # [B] int64
    logprobs: LogprobsTensors | None  # None when no row asked for logprobs


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
        device = torch.device(device)
        self.logitsprocs = build_logitsprocs(vocab_size, device, custom=logits_processors)
        self._num_rows = 0  # rows the processors currently hold state for

    def forward(self, logits: torch.Tensor, metadata: SamplingMetadata) -> SamplerOutput:
        """logits [B, V] -> SamplerOutput with sampled_token_ids [B]."""
        self._refresh_logitsprocs(metadata)
        num_logprobs = metadata.max_num_logprobs
        raw = None
        if num_logprobs is not None and self.logprobs_mode == "raw_logprobs":
            raw = compute_logprobs(logits)
        elif num_logprobs is not None and self.logprobs_mode == "raw_logits":
            raw = logits.to(torch.float32, copy=True)
        logits = self.apply_logits_processors(logits.to(torch.float32), metadata)
        sampled, processed = self.sample(logits, metadata)
        if num_logprobs is None:
            return SamplerOutput(sampled, None)
        reported = raw if processed is None else processed
        return SamplerOutput(sampled, gather_logprobs(reported, num_logprobs, sampled))

    def _refresh_logitsprocs(self, metadata: SamplingMetadata) -> None:
        """Tell every processor the whole batch: each row added at its index, rows past the
        new batch size removed (the full-refresh contract of logits_processors.py)."""
        num_rows = len(metadata.rows)
        update = BatchUpdate(
            batch_size=num_rows,
            removed=list(range(num_rows, self._num_rows)),
            added=[
                (i, row.params, row.prompt_token_ids, row.output_token_ids)
                for i, row in enumerate(metadata.rows)
            ],
            moved=[],
        )
        for processor in self.logitsprocs.all:
            processor.update_state(update)
        self._num_rows = num_rows

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
            )
        return logits

    def sample(
        self, logits: torch.Tensor, metadata: SamplingMetadata
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """-> (sampled [B] int64, processed logprobs or logits [B, V] if a processed mode
        and some row asked for logprobs, else None)."""
        greedy = None if metadata.all_random else logits.argmax(dim=-1)
        if metadata.all_greedy:
            return greedy, self._processed(logits, metadata)
        logits.div_(metadata.temperature.unsqueeze(1))
        for processor in self.logitsprocs.argmax_invariant:
            logits = processor.apply(logits)
        logits = apply_top_k_top_p(logits, metadata.top_k, metadata.top_p)
        processed = self._processed(logits, metadata)
        sampled = random_sample(logits, metadata.generators)
        if greedy is not None:
            sampled = torch.where(metadata.greedy_mask, greedy, sampled)
        return sampled, processed

    def _processed(self, logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor | None:
        if metadata.max_num_logprobs is None or not self.logprobs_mode.startswith("processed"):
            return None
        if self.logprobs_mode == "processed_logprobs":
            return compute_logprobs(logits)
        return logits  # not modified after this point


def random_sample(logits: torch.Tensor, generators: dict[int, torch.Generator]) -> torch.Tensor:
    """logits [B, V] -> [B] int64, one draw per row from softmax(logits).

    Inverts each row's cumulative distribution at one uniform draw: V times fewer random
    numbers than vLLM's exponential race, which dominates sampling time on a CPU (~200 ms
    for 64 rows of 152k tokens). The CDF is float64 so even flat rows of a large vocabulary
    keep each token's share exact. Seeded rows draw from their own generator, so their
    token does not depend on the other rows. Since u < 1, u * total < total and the first
    CDF entry above it belongs to a token of nonzero probability.
    """
    weights = (logits - logits.amax(dim=-1, keepdim=True)).exp_()
    cdf = weights.cumsum(dim=-1, dtype=torch.float64)
    u = torch.rand(logits.shape[0], 1, dtype=torch.float64, device=logits.device)
    for row, generator in generators.items():
        u[row] = torch.rand(1, dtype=torch.float64, device=logits.device, generator=generator)
    return torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(1)
