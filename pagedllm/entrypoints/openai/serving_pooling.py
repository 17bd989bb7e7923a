"""vLLM's generic pooling API, POST /pooling: each prompt's raw pooler output for the
request's pooling task, on any pooling model: an embedding model's vector, a classifier's
label scores, a token classifier's scores of every prompt token ([num_tokens, num_labels]).

The prompts (`input` or `messages`) run through /v1/embeddings' path
(OpenAIServingEmbedding.prompts and pool: tokenized, truncated and checked alike, one
pooling request each, logged and counted in /metrics). A generating server, a task the
model lacks, or fields of another task (`dimensions` on a classifier) answer 400.
"""

import base64
import time

import torch
from fastapi import Request

from pagedllm.entrypoints.openai.errors import OpenAIError, invalid_value_error
from pagedllm.entrypoints.openai.pooling_protocol import (
    PoolingRequest,
    PoolingResponse,
    PoolingResponseData,
)
from pagedllm.entrypoints.openai.responses import UsageInfo
from pagedllm.entrypoints.openai.serving_embedding import OpenAIServingEmbedding
from pagedllm.entrypoints.openai.unsupported_fields import check_unsupported_fields
from pagedllm.pooling_params import PoolingParams


class OpenAIServingPooling:
    """Pools through `embedding`, the server's embeddings endpoint."""

    def __init__(self, embedding: OpenAIServingEmbedding) -> None:
        self.embedding = embedding

    async def create_pooling(
        self, request: PoolingRequest, raw_request: Request
    ) -> PoolingResponse:
        arrival_time = time.monotonic()
        model, _ = self.embedding.check_model(request.model)
        check_unsupported_fields(request.model_extra, "pooling")
        params = self._pooling_params(request)
        prompts = await self.embedding.prompts(request)
        request_id = self.embedding.request_id("pool", raw_request)
        outputs = await self.embedding.pool(prompts, params, request_id, raw_request, arrival_time)
        data = [
            PoolingResponseData(index=i, data=_encode(o.outputs.data, request.encoding_format))
            for i, o in enumerate(outputs)
        ]
        num_tokens = sum(len(ids) for ids in prompts)
        return PoolingResponse(
            id=request_id,
            created=int(time.time()),
            model=model,
            data=data,
            usage=UsageInfo(prompt_tokens=num_tokens, total_tokens=num_tokens),
        )

    def _pooling_params(self, request: PoolingRequest) -> PoolingParams:
        """The request's PoolingParams with its task resolved and checked against the
        model, each refusal a 400 naming its field."""
        config = self.embedding.engine.config.model_config
        if config.runner_type != "pooling":
            raise OpenAIError(
                "The model does not support the Pooling API: this server generates; serve "
                "a pooling model (--runner pooling, or a classifier)",
                param="model",
            )
        try:
            params = PoolingParams(
                dimensions=request.dimensions,
                normalize=request.normalize,
                use_activation=request.use_activation,
                task=request.task,
            )
            params.task = params.verify_task(config.pooling_tasks)
            params.verify(config.pooled_size, config.is_matryoshka, config.matryoshka_dimensions)
            return params
        except (ValueError, TypeError) as e:
            raise invalid_value_error(e, PoolingRequest.model_fields) from e


def _encode(data: torch.Tensor, encoding_format: str) -> list[list[float]] | list[float] | str:
    """JSON numbers in the output's shape, or base64 of its flattened little-endian float32
    bytes (OpenAI's embedding encoding)."""
    if encoding_format == "float":
        return data.tolist()
    raw = data.to(torch.float32).flatten().numpy().astype("<f4").tobytes()
    return base64.b64encode(raw).decode("ascii")
