"""Logits processors: vLLM v1's interface, the built-ins, and the loader for custom ones.

A processor keeps per-row state for the rows of the batch and changes the logits of
those rows in `apply`. It learns about the batch through `update_state(BatchUpdate)`:
requests `added` at an index (replacing whatever was there), indices `removed`, and rows
`moved` (one way, or swapped). Removed indices are processed after added ones and never
name an index that was just added.

Contract with the Sampler (pagedllm/sample/sampler.py): the engine rebuilds the batch each
step, so before every forward the Sampler sends each processor either None, when the batch
holds the same rows in the same order as at the last call (a run of decode steps), or a
full refresh: every row in `added` at its index, the indices past the new batch size in
`removed`, `moved` empty. A processor written for vLLM's persistent batch therefore works
unchanged. Processors whose `is_argmax_invariant()` is False run before the penalties, on
every row; argmax-invariant ones run after temperature, and only affect rows that sample
randomly. Custom processors read their per-request arguments from
`SamplingParams.extra_args`.
"""

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TypeVar

import torch

from pagedllm.device_copy import tensor_to_device, to_device
from pagedllm.sampling_params import SamplingParams


class MoveDirectionality(Enum):
    UNIDIRECTIONAL = 0  # the row at `from` now lives at `to`; `from` is empty
    SWAP = 1  # the rows at `from` and `to` trade places


AddedRequest = tuple[int, SamplingParams, list[int], list[int]]  # index, params, prompt, output
MovedRequest = tuple[int, int, MoveDirectionality]  # from, to, directionality


@dataclass(frozen=True)
class BatchUpdate:
    """How the batch changed since the last update; `batch_size` is the new row count.

    The output list of an added request is the engine's live list: it grows as tokens are
    sampled, so a processor may keep a reference to it.
    """

    batch_size: int
    removed: Sequence[int]
    added: Sequence[AddedRequest]
    moved: Sequence[MovedRequest]


class LogitsProcessor(ABC):
    """A logits transform with per-row state; see the module docstring for the contract."""

    def __init__(self, vocab_size: int, device: torch.device, is_pin_memory: bool = False) -> None:
        self.vocab_size = vocab_size
        self.device = device
        self.is_pin_memory = is_pin_memory

    @classmethod
    def validate_params(cls, params: SamplingParams) -> None:
        """Raise ValueError if `params` (usually its extra_args) are invalid for this class.

        Called by the engine when a request is added."""
        return None

    @abstractmethod
    def is_argmax_invariant(self) -> bool:
        """True if `apply` never changes which token has the largest logit."""

    @abstractmethod
    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """Follow the batch; None means nothing changed since the last call."""

    @abstractmethod
    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """[B, V] -> [B, V]; may modify `logits` in place and return it."""


State = TypeVar("State")


def process_dict_updates(
    entries: dict[int, State],
    batch_update: BatchUpdate | None,
    new_state: Callable[[SamplingParams, list[int], list[int]], State | None],
) -> bool:
    """Apply `batch_update` to index -> state; `new_state` returns None for a request the
    processor ignores. Returns whether `entries` changed."""
    if batch_update is None:
        return False
    updated = False
    for index, params, prompt_ids, output_ids in batch_update.added:
        state = new_state(params, prompt_ids, output_ids)
        if state is not None:
            entries[index] = state
            updated = True
        elif entries.pop(index, None) is not None:
            updated = True
    for index in batch_update.removed:
        updated |= entries.pop(index, None) is not None
    for a, b, directionality in batch_update.moved:
        a_state, b_state = entries.pop(a, None), entries.pop(b, None)
        if a_state is not None:
            entries[b] = a_state
        if b_state is not None and directionality == MoveDirectionality.SWAP:
            entries[a] = b_state
        updated |= a_state is not None or b_state is not None
    return updated


class MinPLogitsProcessor(LogitsProcessor):
    """Drop tokens whose probability is below min_p times the row's largest probability."""

    def __init__(self, vocab_size: int, device: torch.device, is_pin_memory: bool = False) -> None:
        super().__init__(vocab_size, device, is_pin_memory)
        self.min_p_by_row: dict[int, float] = {}
        self.min_p: torch.Tensor | None = None  # [B, 1], 0 where off

    def is_argmax_invariant(self) -> bool:
        return True

    @staticmethod
    def _new_state(params: SamplingParams, _prompt: list[int], _output: list[int]) -> float | None:
        return params.min_p if params.min_p > 0 else None

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        updated = process_dict_updates(self.min_p_by_row, batch_update, self._new_state)
        resized = batch_update is not None and self.min_p is not None
        resized = resized and self.min_p.shape[0] != batch_update.batch_size
        if updated or resized:
            self.min_p = None
            if self.min_p_by_row:
                values = torch.zeros(batch_update.batch_size, 1)
                for index, min_p in self.min_p_by_row.items():
                    values[index] = min_p
                self.min_p = tensor_to_device(values, self.device)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if self.min_p is None:
            return logits
        probs = logits.softmax(dim=-1)
        threshold = probs.amax(dim=-1, keepdim=True) * self.min_p
        return logits.masked_fill_(probs < threshold, float("-inf"))


class LogitBiasLogitsProcessor(LogitsProcessor):
    """Add each request's logit_bias to its row."""

    def __init__(self, vocab_size: int, device: torch.device, is_pin_memory: bool = False) -> None:
        super().__init__(vocab_size, device, is_pin_memory)
        self.bias_by_row: dict[int, dict[int, float]] = {}
        self.indices: tuple[torch.Tensor, torch.Tensor] | None = None  # rows [N], tokens [N]
        self.values: torch.Tensor | None = None  # [N]

    def is_argmax_invariant(self) -> bool:
        return False

    @staticmethod
    def _new_state(
        params: SamplingParams, _prompt: list[int], _output: list[int]
    ) -> dict[int, float] | None:
        return params.logit_bias or None

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if process_dict_updates(self.bias_by_row, batch_update, self._new_state):
            pairs = [(i, t) for i, bias in self.bias_by_row.items() for t in bias]
            values = [b for bias in self.bias_by_row.values() for b in bias.values()]
            self.indices = _index_pair(pairs, self.device)
            self.values = to_device(values, torch.float32, self.device)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if self.indices is None:
            return logits
        return logits.index_put_(self.indices, self.values, accumulate=True)


class MinTokensLogitsProcessor(LogitsProcessor):
    """Ban a request's stop tokens (stop_token_ids and EOS) until it has min_tokens outputs."""

    def __init__(self, vocab_size: int, device: torch.device, is_pin_memory: bool = False) -> None:
        super().__init__(vocab_size, device, is_pin_memory)
        self.by_row: dict[int, tuple[int, list[int], set[int]]] = {}
        self.indices: tuple[torch.Tensor, torch.Tensor] | None = None  # rows [N], tokens [N]

    def is_argmax_invariant(self) -> bool:
        return False

    @staticmethod
    def _new_state(
        params: SamplingParams, _prompt: list[int], output: list[int]
    ) -> tuple[int, list[int], set[int]] | None:
        if params.min_tokens > len(output) and params.all_stop_token_ids:
            return params.min_tokens, output, params.all_stop_token_ids
        return None

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        updated = process_dict_updates(self.by_row, batch_update, self._new_state)
        done = [
            i for i, (min_tokens, output, _) in self.by_row.items() if len(output) >= min_tokens
        ]
        for index in done:
            del self.by_row[index]
        if updated or done:
            pairs = [(i, t) for i, (_, _, stop_ids) in self.by_row.items() for t in stop_ids]
            self.indices = _index_pair(pairs, self.device)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if self.indices is None:
            return logits
        logits[self.indices] = float("-inf")
        return logits


def _index_pair(
    pairs: list[tuple[int, int]], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """[(row, token), ...] -> (rows [N], tokens [N]) for index_put_, or None if empty."""
    if not pairs:
        return None
    rows, tokens = to_device(pairs, torch.long, device).T
    return rows, tokens


BUILTIN_LOGITS_PROCESSORS: tuple[type[LogitsProcessor], ...] = (
    MinTokensLogitsProcessor,
    LogitBiasLogitsProcessor,
    MinPLogitsProcessor,
)


def _load_one(spec: type | str) -> type[LogitsProcessor]:
    if isinstance(spec, str):
        module_name, sep, qualname = spec.partition(":")
        if not sep:
            module_name, _, qualname = spec.rpartition(".")
        if not module_name or not qualname:
            raise ValueError(f"logits processor {spec!r} must be 'module:Class' or a class")
        try:
            obj = importlib.import_module(module_name)
            for part in qualname.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"cannot load logits processor {spec!r}: {e}") from e
        spec = obj
    if not (isinstance(spec, type) and issubclass(spec, LogitsProcessor)):
        raise ValueError(f"logits processor {spec!r} must be a subclass of LogitsProcessor")
    return spec


def load_logits_processors(specs: Sequence[type | str]) -> list[type[LogitsProcessor]]:
    """Resolve classes or "package.module:Class" (or "package.module.Class") strings."""
    return [_load_one(spec) for spec in specs]


class LogitsProcessors:
    """The processors one Sampler drives, split by argmax invariance."""

    def __init__(self, processors: Sequence[LogitsProcessor]) -> None:
        self.all = list(processors)
        self.non_argmax_invariant = [p for p in self.all if not p.is_argmax_invariant()]
        self.argmax_invariant = [p for p in self.all if p.is_argmax_invariant()]

    def validate_params(self, params: SamplingParams) -> None:
        """Every processor's class check; the engine calls it when a request is added."""
        for cls in dict.fromkeys(type(p) for p in self.all):
            cls.validate_params(params)


def build_logitsprocs(
    vocab_size: int,
    device: torch.device,
    is_pin_memory: bool = False,
    custom: Sequence[type | str] = (),
) -> LogitsProcessors:
    """The built-ins (min_tokens, logit_bias, min_p) followed by the custom processors."""
    classes = [*BUILTIN_LOGITS_PROCESSORS, *load_logits_processors(custom)]
    return LogitsProcessors([cls(vocab_size, device, is_pin_memory) for cls in classes])
