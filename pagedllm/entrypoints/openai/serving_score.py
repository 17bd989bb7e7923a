"""vLLM's score API on an embedding model: POST /score and /v1/score (each pair's cosine
similarity), and its rerank API (Jina's and Cohere's shape): POST /rerank, /v1/rerank and
/v2/rerank (documents ranked by their score against a query).

The texts run through /v1/embeddings' path (OpenAIServingEmbedding.pool: one pooling
request each, logged and counted in /metrics as embeddings are); pagedllm/scoring.py pairs
them and scores each pair, as LLM.score does. A server of a generating model answers 400.
"""

import time

from fastapi import Request

from pagedllm.entrypoints.openai.errors import OpenAIError, invalid_value_error
from pagedllm.entrypoints.openai.score_protocol import (
    RerankDocument,
    RerankRequest,
    RerankResponse,
    RerankResult,
    ScoreInputs,
    ScoreRequest,
    ScoreResponse,
    ScoreResponseData,
    ScoreUsage,
)
from pagedllm.entrypoints.openai.serving_embedding import OpenAIServingEmbedding
from pagedllm.entrypoints.openai.unsupported_fields import check_unsupported_fields
from pagedllm.outputs import ScoringRequestOutput
from pagedllm.pooling_params import PoolingParams
from pagedllm.scoring import as_score_inputs, check_score_lengths, cosine_scores


class OpenAIServingScore:
    """Scores through `embedding`, the server's embeddings endpoint."""

    def __init__(self, embedding: OpenAIServingEmbedding) -> None:
        self.embedding = embedding

    async def create_score(self, request: ScoreRequest, raw_request: Request) -> ScoreResponse:
        arrival_time = time.monotonic()
        model = self._check(request, "Score")
        names, data_1, data_2 = request.sides()
        request_id = self.embedding.request_id("score", raw_request)
        scores = await self._score(
            names, data_1, data_2, request, request_id, raw_request, arrival_time
        )
        data = [ScoreResponseData(index=i, score=s.outputs.score) for i, s in enumerate(scores)]
        return ScoreResponse(
            id=request_id, created=int(time.time()), model=model, data=data, usage=_usage(scores)
        )

    async def do_rerank(self, request: RerankRequest, raw_request: Request) -> RerankResponse:
        """The documents by score, best first (ties in input order); `top_n` of them."""
        arrival_time = time.monotonic()
        model = self._check(request, "Rerank")
        request_id = self.embedding.request_id("rerank", raw_request)
        scores = await self._score(
            ("query", "documents"),
            request.query,
            request.documents,
            request,
            request_id,
            raw_request,
            arrival_time,
        )
        results = [
            RerankResult(
                index=i, document=RerankDocument(text=text), relevance_score=s.outputs.score
            )
            for i, (text, s) in enumerate(zip(request.documents, scores, strict=True))
        ]
        results.sort(key=lambda result: result.relevance_score, reverse=True)
        top_n = request.top_n or len(results)
        return RerankResponse(
            id=request_id, model=model, usage=_usage(scores), results=results[:top_n]
        )

    def _check(self, request: ScoreRequest | RerankRequest, api: str) -> str:
        """The model name to answer with, after the 404 / 400s that come before any work."""
        model, _ = self.embedding.check_model(request.model)
        self.embedding.check_pooling(api)
        check_unsupported_fields(request.model_extra, "embedding")
        return model

    async def _score(
        self,
        names: tuple[str, str],
        data_1: ScoreInputs,
        data_2: ScoreInputs,
        request: ScoreRequest | RerankRequest,
        request_id: str,
        raw_request: Request,
        arrival_time: float,
    ) -> list[ScoringRequestOutput]:
        """Each pair's score; `names`: the request's fields for the two sides (a bad side
        is a 400 naming its field)."""
        texts_1, texts_2 = as_score_inputs(data_1), as_score_inputs(data_2)
        try:
            check_score_lengths(len(texts_1), len(texts_2), names)
        except ValueError as e:
            raise invalid_value_error(e, names) from e
        keep = request.truncate_prompt_tokens
        sides = ((names[0], texts_1), (names[1], texts_2))
        prompts = [await self._prompt(text, name, keep) for name, texts in sides for text in texts]
        outputs = await self.embedding.pool(
            prompts, PoolingParams(), request_id, raw_request, arrival_time
        )
        pad_token_id = self.embedding.tokenizer.pad_token_id
        return cosine_scores(outputs[: len(texts_1)], outputs[len(texts_1) :], pad_token_id)

    async def _prompt(self, text: str, param: str, keep: int | None) -> list[int]:
        """A text's token ids (with the tokenizer's special tokens, as vLLM's), cut to its
        last `keep`; an empty text is a 400, as in /v1/embeddings."""
        if text == "":
            raise OpenAIError(f"{param} holds an empty text; give at least 1 token", param=param)
        ids = self.embedding.truncated(await self.embedding.encode(text), keep)
        return self.embedding.check_prompt(ids, param)


def _usage(scores: list[ScoringRequestOutput]) -> ScoreUsage:
    """vLLM's count: each pair's tokens (pagedllm/scoring.py), so a text scored against N
    others counts N times."""
    num_tokens = sum(len(s.prompt_token_ids) for s in scores)
    return ScoreUsage(prompt_tokens=num_tokens, total_tokens=num_tokens)
