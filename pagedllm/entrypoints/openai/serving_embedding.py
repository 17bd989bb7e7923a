"""POST /v1/embeddings (OpenAI's): one embedding per input, pooled by an embedding model
(`--runner pooling`, or a sentence-transformers folder). A server of a generating model or
of a classifier answers 400, as vLLM does. The score, rerank and classification endpoints
(serving_score.py, serving_classification.py) run their prompts through the same checks
and `pool`."""

import base64
import time
from contextlib import aclosing

import torch
from fastapi import Request

from pagedllm.entrypoints.openai.embedding_protocol import (
    EmbeddingRequest,
    EmbeddingResponse,
    EmbeddingResponseData,
    EmbeddingUsage,
    PoolingInput,
    PoolingPromptRequest,
)
from pagedllm.entrypoints.openai.errors import OpenAIError, engine_error, invalid_value_error
from pagedllm.entrypoints.openai.protocol import TokenIds
from pagedllm.entrypoints.openai.serving_engine import OpenAIServing, pooling_routes
from pagedllm.entrypoints.openai.streaming import merge_streams, until_disconnected
from pagedllm.entrypoints.openai.unsupported_fields import check_unsupported_fields
from pagedllm.outputs import PoolingRequestOutput
from pagedllm.pooling_params import PoolingParams


class OpenAIServingEmbedding(OpenAIServing):
    async def create_embedding(
        self, request: EmbeddingRequest, raw_request: Request
    ) -> EmbeddingResponse:
        arrival_time = time.monotonic()
        model, _ = self.check_model(request.model)
        self.check_pooling("Embeddings", "embed")
        check_unsupported_fields(request.model_extra, "embedding")
        params = self._pooling_params(request)
        prompts = await self.prompts(request)
        request_id = self.request_id("embd", raw_request)
        outputs = await self.pool(prompts, params, request_id, raw_request, arrival_time)
        data = [
            EmbeddingResponseData(index=i, embedding=_encode(o.outputs.data, request))
            for i, o in enumerate(outputs)
        ]
        num_tokens = sum(len(ids) for ids in prompts)
        return EmbeddingResponse(
            id=request_id,
            created=int(time.time()),
            model=model,
            data=data,
            usage=EmbeddingUsage(prompt_tokens=num_tokens, total_tokens=num_tokens),
        )

    def check_pooling(self, api: str, task: str) -> None:
        """A 400 naming the `api` ("Embeddings", "Score", ...) where the model lacks its
        pooling `task`, as vLLM's: on a generating server, and across the two kinds of
        pooling model (a classifier does not embed, an embedding model does not classify)."""
        config = self.engine.config.model_config
        if config.runner_type != "pooling":
            raise OpenAIError(
                f"The model does not support the {api} API: this server generates; serve "
                "an embedding model with --runner pooling, or a classifier",
                param="model",
            )
        if task not in config.pooling_tasks:
            raise OpenAIError(
                f"The model does not support the {api} API: this model is "
                f"{config.pooling_kind}; it "
                f"serves {pooling_routes(config.pooling_tasks)}",
                param="model",
            )

    async def pool(
        self,
        prompts: list[TokenIds],
        params: PoolingParams,
        request_id: str,
        raw_request: Request,
        arrival_time: float,
    ) -> list[PoolingRequestOutput]:
        """Each prompt's pooled output, in order: the engine runs the Nth as
        `<request_id>-N`, logged (--enable-log-requests) and counted in /metrics."""
        streams = []
        for i, ids in enumerate(prompts):
            prompt, prompt_id = {"prompt_token_ids": ids}, f"{request_id}-{i}"
            outputs = self.engine.encode(prompt, params, prompt_id)
            outputs = self.logged(prompt_id, prompt, params, outputs)
            streams.append(self.metrics.track_pooling(outputs, arrival_time))
        return await until_disconnected(_collect(streams), raw_request)

    def check_prompt(self, ids: TokenIds, param: str) -> list[int]:
        """A 400 naming `param` for an empty prompt, one longer than max_model_len, or a
        token id outside the vocabulary."""
        if not ids:
            raise OpenAIError(
                f"{param} holds an empty prompt (0 tokens); give at least 1", param=param
            )
        if len(ids) > self.max_model_len:
            raise OpenAIError(
                f"This model's maximum context length is {self.max_model_len} tokens, but "
                f"a prompt of {param} has {len(ids)} tokens.",
                param=param,
                code="context_length_exceeded",
            )
        return self.check_token_ids(ids, param)

    def _pooling_params(self, request: EmbeddingRequest) -> PoolingParams:
        """The request's PoolingParams, checked against the model here too (the engine
        checks again), so a bad `dimensions` is a 400 naming it."""
        config = self.engine.config.model_config
        try:
            params = PoolingParams(dimensions=request.dimensions, normalize=request.normalize)
            params.verify(config.pooled_size, config.is_matryoshka, config.matryoshka_dimensions)
            return params
        except (ValueError, TypeError) as e:
            raise invalid_value_error(e, EmbeddingRequest.model_fields) from e

    async def prompts(self, request: PoolingPromptRequest) -> list[TokenIds]:
        """Each input's token ids (texts tokenized here; a list of ints is one input, the
        messages one conversation), cut to their last `truncate_prompt_tokens`."""
        if (request.input is None) == (request.messages is None):
            raise OpenAIError("give exactly one of input and messages", param="input")
        if request.messages is not None:
            specials = request.add_special_tokens is True
            prompts = [await self.chat_prompt_ids(request, specials)]
        else:
            prompts = await self._input_ids(request.input, request.add_special_tokens is not False)
        prompts = [self.truncated(ids, request.truncate_prompt_tokens) for ids in prompts]
        param = "input" if request.messages is None else "messages"
        return [self.check_prompt(ids, param) for ids in prompts]

    async def _input_ids(self, inputs: PoolingInput, add_special_tokens: bool) -> list[TokenIds]:
        """`input`'s items as token ids; an empty text or list is a 400, as OpenAI's."""
        if isinstance(inputs, str) or (inputs and isinstance(inputs[0], int)):
            inputs = [inputs]
        if not inputs:
            raise OpenAIError("input must not be an empty list", param="input")
        if any(item == "" for item in inputs):
            raise OpenAIError("an input is an empty string; give at least 1 token", param="input")
        return [
            await self.encode(item, add_special_tokens) if isinstance(item, str) else item
            for item in inputs
        ]


async def _collect(streams: list) -> list[PoolingRequestOutput]:
    """The one output of each pooling stream, in order (an error: 400 / 500 / 503)."""
    outputs: list[PoolingRequestOutput | None] = [None] * len(streams)
    async with aclosing(merge_streams(streams)) as merged:
        try:
            async for i, output in merged:
                outputs[i] = output
        except Exception as e:
            raise engine_error(e) from e
    return outputs


def _encode(embedding: torch.Tensor, request: EmbeddingRequest) -> list[float] | str:
    """OpenAI's encodings: a list of floats, or base64 of the little-endian float32 bytes."""
    if request.encoding_format == "float":
        return embedding.tolist()
    data = embedding.to(torch.float32).numpy().astype("<f4").tobytes()
    return base64.b64encode(data).decode("ascii")
