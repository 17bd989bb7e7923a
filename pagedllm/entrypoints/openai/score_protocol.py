"""Request and response bodies of vLLM's POST /score and /v1/score, and of its rerank API
(POST /rerank, /v1/rerank, /v2/rerank: Jina's and Cohere's shape)."""

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from pagedllm.entrypoints.openai.protocol import OpenAIBaseModel, OpenAIRequestModel

ScoreInputs = str | list[str]

# vLLM's names for a score's two sides: its first, its newer, its generic.
SCORE_FIELD_PAIRS = (("text_1", "text_2"), ("queries", "documents"), ("data_1", "data_2"))


class ScoreRequest(OpenAIRequestModel):
    """One pair of sides, each a text or a list of texts: `text_1` and `text_2`, or
    `queries` and `documents`, or `data_1` and `data_2` (vLLM's names; one pair only).
    One text against N gives N scores, N against N pairs them in order.
    `truncate_prompt_tokens`: keep each prompt's last N tokens (-1: the model's context
    length), as vLLM: each text's on an embedding model, each pair's on a cross-encoder.
    `use_activation`: a cross-encoder's score activation (False: its raw logit); an
    embedding model's cosine does not change with it."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)  # refused fields: a 400

    model: str | None = None
    text_1: ScoreInputs | None = None
    text_2: ScoreInputs | None = None
    queries: ScoreInputs | None = None
    documents: ScoreInputs | None = None
    data_1: ScoreInputs | None = None
    data_2: ScoreInputs | None = None
    truncate_prompt_tokens: int | None = Field(None, ge=-1)
    use_activation: bool | None = None
    user: str | None = None

    @model_validator(mode="after")
    def _one_pair(self) -> "ScoreRequest":
        given = [names for names in SCORE_FIELD_PAIRS if self._given(names)]
        if not given:
            raise ValueError("text_1 and text_2 (or queries and documents) are required")
        if len(given) > 1:
            named = [name for pair in given for name in pair if getattr(self, name) is not None]
            raise ValueError(
                f"{named[-1]} and {named[0]} are from different pairs of names; give one "
                "pair: text_1 and text_2, queries and documents, or data_1 and data_2"
            )
        first, second = given[0]
        for name, other in ((first, second), (second, first)):
            if getattr(self, other) is None:
                raise ValueError(f"{name} needs {other}: give both sides")
        return self

    def _given(self, names: tuple[str, str]) -> bool:
        return any(getattr(self, name) is not None for name in names)

    def sides(self) -> tuple[tuple[str, str], ScoreInputs, ScoreInputs]:
        """The pair of fields given: their names and their values."""
        names = next(names for names in SCORE_FIELD_PAIRS if self._given(names))
        return names, getattr(self, names[0]), getattr(self, names[1])


class RerankRequest(OpenAIRequestModel):
    """`documents` ranked by their score against `query`, best first; `top_n`: keep the
    best N (0, the default: all). `truncate_prompt_tokens` and `use_activation` as in
    ScoreRequest."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)  # refused fields: a 400

    model: str | None = None
    query: str
    documents: list[str]
    top_n: int = Field(0, ge=0)
    truncate_prompt_tokens: int | None = Field(None, ge=-1)
    use_activation: bool | None = None
    user: str | None = None


class ScoreResponseData(OpenAIBaseModel):
    index: int
    object: Literal["score"] = "score"
    score: float


class ScoreUsage(OpenAIBaseModel):
    prompt_tokens: int
    total_tokens: int


class ScoreResponse(OpenAIBaseModel):
    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[ScoreResponseData]
    usage: ScoreUsage


class RerankDocument(OpenAIBaseModel):
    text: str


class RerankResult(OpenAIBaseModel):
    index: int
    document: RerankDocument
    relevance_score: float


class RerankResponse(OpenAIBaseModel):
    id: str
    model: str
    usage: ScoreUsage
    results: list[RerankResult]
