"""What the engine returns: vLLM's RequestOutput / CompletionOutput / Logprob for
generation, PoolingRequestOutput / EmbeddingRequestOutput for pooling."""

from dataclasses import dataclass, field

import torch


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


SampleLogprobs = list[dict[int, Logprob]]
PromptLogprobs = list[dict[int, Logprob] | None]


@dataclass
class CompletionOutput:
    """One generated sequence. finish_reason is "stop", "length", "abort", "error" (its
    request failed: see RequestOutput.error) or None (running); stop_reason is the stop
    string or stop token id that ended it, else None."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: SampleLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """`error` is set when this request alone failed (e.g. no token could be sampled under
    its parameters, or its stop check raised): it is finished, the other requests go on.
    `metrics`, on the finished output only: the request's timestamps in seconds of
    time.monotonic(), vLLM's names (`arrival_time`, `first_scheduled_time`,
    `first_token_time`, `last_token_time`; those it reached), from which /metrics takes
    its queue, prefill, decode and inference times (engine/stats.py). `engine_index`: the
    data-parallel replica that ran it (vLLM's EngineCoreOutputs field; 0 with one engine),
    the `engine` label of its /metrics observations."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: PromptLogprobs | None
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    error: Exception | None = None
    engine_index: int = 0


@dataclass
class PoolingOutput:
    """vLLM's: the pooled vector of one prompt, `data` [hidden] (or [dimensions]) float32."""

    data: torch.Tensor


@dataclass
class PoolingRequestOutput:
    """A pooling request's result (vLLM's); `error`, `metrics`, `engine_index` as in
    RequestOutput."""

    request_id: str
    outputs: PoolingOutput
    prompt_token_ids: list[int]
    finished: bool
    error: Exception | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    engine_index: int = 0


@dataclass
class EmbeddingOutput:
    embedding: list[float]

    @property
    def hidden_size(self) -> int:
        return len(self.embedding)


@dataclass
class EmbeddingRequestOutput:
    """What `LLM.embed` returns (vLLM's): `outputs.embedding` is a list of floats."""

    request_id: str
    outputs: EmbeddingOutput
    prompt_token_ids: list[int]
    finished: bool

    @classmethod
    def from_base(cls, output: PoolingRequestOutput) -> "EmbeddingRequestOutput":
        embedding = EmbeddingOutput(output.outputs.data.tolist())
        return cls(output.request_id, embedding, output.prompt_token_ids, output.finished)
