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

    def extended(self, delta: "CompletionOutput") -> "CompletionOutput":
        """This completion followed by `delta`, the next DELTA output's part of it (a new
        object: neither is changed)."""
        logprobs = None
        if self.logprobs is not None or delta.logprobs is not None:
            logprobs = (self.logprobs or []) + (delta.logprobs or [])
        return CompletionOutput(
            index=self.index,
            text=self.text + delta.text,
            token_ids=self.token_ids + delta.token_ids,
            cumulative_logprob=delta.cumulative_logprob,
            logprobs=logprobs,
            finish_reason=delta.finish_reason,
            stop_reason=delta.stop_reason,
        )


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

    def add(self, next_output: "RequestOutput") -> None:
        """Merge the request's next DELTA output into this one (vLLM's
        `RequestOutput.add` with aggregate): each completion's new text, tokens and
        logprobs are appended, and the prompt logprobs' next piece; whether it finished,
        its cached tokens, metrics and error are the next output's. `next_output` is not
        changed, nor are the lists of this one's completions (they are replaced)."""
        by_index = {c.index: c for c in self.outputs}
        for delta in next_output.outputs:
            before = by_index.get(delta.index)
            by_index[delta.index] = delta if before is None else before.extended(delta)
        self.outputs = [by_index[i] for i in sorted(by_index)]
        self.prompt_logprobs = join_prompt_logprobs(
            self.prompt_logprobs, next_output.prompt_logprobs
        )
        self.finished = next_output.finished
        self.num_cached_tokens = next_output.num_cached_tokens
        self.metrics = next_output.metrics
        self.error = next_output.error


def join_prompt_logprobs(
    total: PromptLogprobs | None, delta: PromptLogprobs | None
) -> PromptLogprobs | None:
    """DELTA outputs carry prompt logprobs piece by piece (one per prefill chunk)."""
    if delta is None:
        return total
    return (total or []) + delta


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


@dataclass
class ClassificationOutput:
    """vLLM's: one prompt's score per label (after the classifier's activation, where it
    runs: probabilities under softmax or sigmoid)."""

    probs: list[float]

    @property
    def num_classes(self) -> int:
        return len(self.probs)


@dataclass
class ClassificationRequestOutput:
    """What `LLM.classify` returns per prompt (vLLM's): `outputs.probs`."""

    request_id: str
    outputs: ClassificationOutput
    prompt_token_ids: list[int]
    finished: bool

    @classmethod
    def from_base(cls, output: PoolingRequestOutput) -> "ClassificationRequestOutput":
        probs = ClassificationOutput(output.outputs.data.tolist())
        return cls(output.request_id, probs, output.prompt_token_ids, output.finished)


@dataclass
class ScoringOutput:
    """vLLM's: the score of one pair of texts (for an embedding model, the cosine
    similarity of their embeddings; for a cross-encoder, its one label's score)."""

    score: float


@dataclass
class ScoringRequestOutput:
    """What `LLM.score` returns per pair (vLLM's): `outputs.score`; `prompt_token_ids` are
    the pair's (pagedllm/scoring.py), `request_id` joins the two texts' ids with `_`."""

    request_id: str
    outputs: ScoringOutput
    prompt_token_ids: list[int]
    finished: bool
