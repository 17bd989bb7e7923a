"""A pooling request's state across steps: its prompt's sequence (prefill only), the
pooling accumulated over its chunks, and the PoolingRequestOutput it shows when done."""

import time

import torch

from pagedllm.core.sequence import Sequence
from pagedllm.engine.stats import request_metrics
from pagedllm.layers.classifier import SequenceClassifier
from pagedllm.layers.pooler import Pooled, accumulate, finish_pooling
from pagedllm.layers.st_projector import StProjector
from pagedllm.outputs import PoolingOutput, PoolingRequestOutput
from pagedllm.pooler_config import PoolerConfig
from pagedllm.pooling_params import PoolingParams


class PoolingRequest:
    def __init__(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: PoolingParams,
        seq: Sequence,
        arrival_time: float | None = None,
    ) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.params = params
        self.seq = seq
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        self.pooled: Pooled | None = None  # as layers/pooler.py accumulates
        self.embedding: torch.Tensor | None = None  # set when the last chunk has run
        self.error: Exception | None = None

    @property
    def finished(self) -> bool:
        return self.error is not None or self.embedding is not None

    def add_chunk(self, partial: torch.Tensor, start: int, pooling_type: str) -> None:
        """A chunk at prompt position `start` gave `partial`."""
        self.pooled = accumulate(self.pooled, partial, start, pooling_type)

    def finish(
        self,
        config: PoolerConfig,
        projector: StProjector | None = None,
        classifier: SequenceClassifier | None = None,
    ) -> None:
        """The prompt's last chunk has run: pool it as the model's config (and its Dense
        modules, `projector`) and the request's params say; a classifier's pooled state
        goes through its head instead (the request's task picks the activation)."""
        assert self.pooled is not None, "a finished pooled prompt has pooled at least a chunk"
        params = self.params
        if classifier is not None:
            pooled = finish_pooling(
                self.pooled, len(self.prompt_token_ids), config.pooling_type, False
            )
            use_activation = params.use_activation
            if use_activation is None:
                use_activation = config.use_activation is not False
            self.embedding = classifier(pooled, params.task or "classify", use_activation)
            return
        normalize = params.normalize
        if normalize is None:  # vLLM: an embedding's activation is its normalisation
            normalize = config.normalize if params.use_activation is None else params.use_activation
        self.embedding = finish_pooling(
            self.pooled,
            len(self.prompt_token_ids),
            config.pooling_type,
            normalize,
            self.params.dimensions,
            projector,
        ).cpu()

    def make_output(self) -> PoolingRequestOutput | None:
        """The output once finished (pooling has no partial outputs), else None."""
        if not self.finished:
            return None
        data = self.embedding if self.embedding is not None else torch.empty(0)
        # Pooling's one "token" is its pooled vector: first token = last token = now.
        done = time.monotonic() if self.embedding is not None else None
        metrics = request_metrics(self.arrival_time, self.seq.first_scheduled_time, done, done)
        return PoolingRequestOutput(
            self.request_id, PoolingOutput(data), self.prompt_token_ids, True, self.error, metrics
        )
