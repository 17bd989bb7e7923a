"""vLLM's classification API: POST /classify (and /v1/classify, as SGLang and clients call
it): each prompt's label scores by a classifier (a `*ForSequenceClassification` checkpoint),
and its best label's name.

The prompts (`input` or `messages`) run through /v1/embeddings' path
(OpenAIServingEmbedding.prompts and pool: tokenized, truncated and checked alike, one
pooling request each, logged and counted in /metrics). A server of a generating model or of
an embedding model answers 400, as vLLM does.
"""

import time

import torch
from fastapi import Request

from pagedllm.classifier_config import ClassifierConfig
from pagedllm.entrypoints.openai.classify_protocol import (
    ClassificationData,
    ClassificationRequest,
    ClassificationResponse,
)
from pagedllm.entrypoints.openai.responses import UsageInfo
from pagedllm.entrypoints.openai.serving_embedding import OpenAIServingEmbedding
from pagedllm.entrypoints.openai.unsupported_fields import check_unsupported_fields
from pagedllm.pooling_params import PoolingParams


class OpenAIServingClassification:
    """Classifies through `embedding`, the server's embeddings endpoint."""

    def __init__(self, embedding: OpenAIServingEmbedding) -> None:
        self.embedding = embedding

    async def create_classify(
        self, request: ClassificationRequest, raw_request: Request
    ) -> ClassificationResponse:
        arrival_time = time.monotonic()
        model, _ = self.embedding.check_model(request.model)
        self.embedding.check_pooling("Classification", "classify")
        check_unsupported_fields(request.model_extra, "classify")
        params = PoolingParams(task="classify", use_activation=request.use_activation)
        prompts = await self.embedding.prompts(request)
        request_id = self.embedding.request_id("classify", raw_request)
        outputs = await self.embedding.pool(prompts, params, request_id, raw_request, arrival_time)
        config = self.embedding.engine.config.model_config.classifier_config
        data = [_data(i, o.outputs.data, config) for i, o in enumerate(outputs)]
        num_tokens = sum(len(ids) for ids in prompts)
        return ClassificationResponse(
            id=request_id,
            created=int(time.time()),
            model=model,
            data=data,
            usage=UsageInfo(prompt_tokens=num_tokens, total_tokens=num_tokens),
        )


def _data(index: int, scores: torch.Tensor, config: ClassifierConfig) -> ClassificationData:
    """One prompt's answer from its label scores [num_labels]: the best label named by
    id2label (argmax, as vLLM's)."""
    probs = scores.float().tolist()
    label = config.label(int(scores.argmax()))
    return ClassificationData(index=index, label=label, probs=probs, num_classes=len(probs))
