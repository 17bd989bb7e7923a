"""vLLM's score API: POST /score and /v1/score (a score for each pair of texts), and its
rerank API (Jina's and Cohere's shape): POST /rerank, /v1/rerank and /v2/rerank (documents
ranked by their score against a query). pagedllm/scoring.py pairs the texts and scores each
pair, as LLM.score does:
- an embedding model (a bi-encoder) embeds each text on its own, one pooling request
  each, and a pair's score is the cosine similarity of its two embeddings;
- a classifier with one label (a cross-encoder or reranker) takes each pair as one prompt
  (cross_encoder_prompt: through the server's --chat-template as the score template, where
  one is given), one pooling request each, and a pair's score is its label's.
The prompts run through /v1/embeddings' path (OpenAIServingEmbedding.pool: logged and
counted in /metrics as embeddings are). A server of a generating model answers 400.
"""

import time
from collections.abc import Callable

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
from pagedllm.outputs import PoolingRequestOutput, ScoringRequestOutput
from pagedllm.pooling_params import PoolingParams
from pagedllm.sampling_params import truncation_size
from pagedllm.scoring import (
    as_score_inputs,
    check_score_lengths,
    cosine_scores,
    cross_encoder_scores,
    paired,
)
from pagedllm.value_checks import as_truncate_prompt_tokens

Scorer = Callable[[list[PoolingRequestOutput]], list[ScoringRequestOutput]]


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
        self.embedding.check_pooling(api, "score")  # a classifier of several labels: 400
        check_unsupported_fields(request.model_extra, "classify")
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
        for name, texts in ((names[0], texts_1), (names[1], texts_2)):
            if "" in texts:
                raise OpenAIError(f"{name} holds an empty text; give at least 1 token", param=name)
        if self.embedding.engine.config.model_config.is_cross_encoder:
            prompts, params, scorer = await self._cross_encoder(names, texts_1, texts_2, request)
        else:
            prompts, params, scorer = await self._bi_encoder(names, texts_1, texts_2, request)
        outputs = await self.embedding.pool(prompts, params, request_id, raw_request, arrival_time)
        return scorer(outputs)

    async def _bi_encoder(
        self,
        names: tuple[str, str],
        texts_1: list[str],
        texts_2: list[str],
        request: ScoreRequest | RerankRequest,
    ) -> tuple[list[list[int]], PoolingParams, Scorer]:
        """Each text's prompt, the embedding's params (`use_activation` changes no cosine:
        it ignores the vectors' lengths), and the pairs' cosines."""
        keep = request.truncate_prompt_tokens
        sides = ((names[0], texts_1), (names[1], texts_2))
        prompts = [await self._prompt(text, name, keep) for name, texts in sides for text in texts]
        pad_token_id = self.embedding.tokenizer.pad_token_id

        def scorer(outputs: list[PoolingRequestOutput]) -> list[ScoringRequestOutput]:
            n = len(texts_1)
            return cosine_scores(outputs[:n], outputs[n:], pad_token_id)

        return prompts, PoolingParams(), scorer

    async def _cross_encoder(
        self,
        names: tuple[str, str],
        texts_1: list[str],
        texts_2: list[str],
        request: ScoreRequest | RerankRequest,
    ) -> tuple[list[list[int]], PoolingParams, Scorer]:
        """Each pair's one prompt (the score template's where the server has one), cut to
        `truncate_prompt_tokens` as the tokenizer cuts a pair (vLLM's rule: the longer text
        loses tokens first); a prompt too long is a 400 naming the second side."""
        config = self.embedding.engine.config.model_config.classifier_config
        template = self.embedding.chat_template
        try:
            max_length = truncation_size(
                as_truncate_prompt_tokens(request.truncate_prompt_tokens),
                self.embedding.max_model_len,
            )
        except (ValueError, TypeError) as e:
            raise OpenAIError(str(e), param="truncate_prompt_tokens") from e
        prompts = []
        for text_1, text_2 in paired(texts_1, texts_2):
            try:
                _, ids = await self.embedding.async_tokenizer.cross_encoder_prompt(
                    config, text_1, text_2, template, max_length
                )
            except ValueError as e:
                raise OpenAIError(str(e)) from e
            prompts.append(self.embedding.check_prompt(ids, names[1]))
        params = PoolingParams(task="score", use_activation=request.use_activation)
        return prompts, params, cross_encoder_scores

    async def _prompt(self, text: str, param: str, keep: int | None) -> list[int]:
        """A text's token ids (with the tokenizer's special tokens, as vLLM's), cut to its
        last `keep`."""
        ids = self.embedding.truncated(await self.embedding.encode(text), keep)
        return self.embedding.check_prompt(ids, param)


def _usage(scores: list[ScoringRequestOutput]) -> ScoreUsage:
    """vLLM's count: each pair's tokens (pagedllm/scoring.py), so a text scored against N
    others counts N times."""
    num_tokens = sum(len(s.prompt_token_ids) for s in scores)
    return ScoreUsage(prompt_tokens=num_tokens, total_tokens=num_tokens)
