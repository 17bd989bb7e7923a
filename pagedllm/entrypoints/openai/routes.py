"""The server's routes: each parses its body and hands it to the serving object build_app
puts on the app's state (api_server.py). The OpenAPI schema at /openapi.json comes from
them. `runtime_lora_router`'s routes change the LoRA adapters served; build_app includes
them only where runtime updating is on (serving_models.runtime_lora_updating)."""

import importlib.metadata
from http import HTTPStatus
from typing import Literal

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from pagedllm.entrypoints.openai.anthropic_protocol import (
    AnthropicErrorResponse,
    CountTokensRequest,
    CountTokensResponse,
    MessagesRequest,
    MessagesResponse,
)
from pagedllm.entrypoints.openai.classify_protocol import (
    ClassificationRequest,
    ClassificationResponse,
)
from pagedllm.entrypoints.openai.embedding_protocol import EmbeddingRequest, EmbeddingResponse
from pagedllm.entrypoints.openai.errors import error_response
from pagedllm.entrypoints.openai.pooling_protocol import PoolingRequest, PoolingResponse
from pagedllm.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    LoadLoRAAdapterRequest,
    TokenizeRequest,
    UnloadLoRAAdapterRequest,
)
from pagedllm.entrypoints.openai.responses import (
    ChatCompletionResponse,
    CompletionResponse,
    DetokenizeResponse,
    ErrorResponse,
    ModelList,
    TokenizeResponse,
    VersionResponse,
)
from pagedllm.entrypoints.openai.responses_protocol import (
    DeletedResponse,
    InputItemList,
    ResponseObject,
    ResponsesRequest,
)
from pagedllm.entrypoints.openai.score_protocol import (
    RerankRequest,
    RerankResponse,
    ScoreRequest,
    ScoreResponse,
)

_ERRORS = {status: {"model": ErrorResponse} for status in (400, 401, 404, 413, 500, 503)}
_ANTHROPIC_ERRORS = {
    status: {"model": AnthropicErrorResponse} for status in (400, 401, 404, 413, 500, 503)
}
_SSE = {200: {"content": {"text/event-stream": {}}, "description": "JSON, or SSE if stream"}}

router = APIRouter()
runtime_lora_router = APIRouter()


@router.get("/health", responses={503: {"model": ErrorResponse}})
async def health(raw_request: Request) -> Response:
    if not raw_request.app.state.engine.is_running:
        return error_response("the engine is not running", HTTPStatus.SERVICE_UNAVAILABLE)
    return Response(status_code=HTTPStatus.OK)


@router.get("/version")
async def version() -> VersionResponse:
    return VersionResponse(version=importlib.metadata.version("pagedllm"))


@router.get("/metrics", response_class=Response)
async def metrics(raw_request: Request) -> Response:
    body = raw_request.app.state.metrics.render()
    return Response(content=body, media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/models", responses=_ERRORS)
async def show_models(raw_request: Request) -> ModelList:
    return raw_request.app.state.serving_models.show_available_models()


@router.post("/v1/completions", response_model=CompletionResponse, responses={**_ERRORS, **_SSE})
async def create_completion(request: CompletionRequest, raw_request: Request) -> Response:
    serving = raw_request.app.state.serving_completion
    return await serving.create_completion(request, raw_request)


@router.post(
    "/v1/chat/completions", response_model=ChatCompletionResponse, responses={**_ERRORS, **_SSE}
)
async def create_chat_completion(request: ChatCompletionRequest, raw_request: Request) -> Response:
    serving = raw_request.app.state.serving_chat
    return await serving.create_chat_completion(request, raw_request)


@router.post("/v1/embeddings", responses=_ERRORS)
async def create_embedding(request: EmbeddingRequest, raw_request: Request) -> EmbeddingResponse:
    return await raw_request.app.state.serving_embedding.create_embedding(request, raw_request)


@router.post("/classify", responses=_ERRORS, operation_id="create_classify")
@router.post("/v1/classify", responses=_ERRORS, operation_id="create_classify_v1")
async def create_classify(
    request: ClassificationRequest, raw_request: Request
) -> ClassificationResponse:
    serving = raw_request.app.state.serving_classification
    return await serving.create_classify(request, raw_request)


@router.post("/pooling", responses=_ERRORS)
async def create_pooling(request: PoolingRequest, raw_request: Request) -> PoolingResponse:
    return await raw_request.app.state.serving_pooling.create_pooling(request, raw_request)


@router.post("/score", responses=_ERRORS, operation_id="create_score")
@router.post("/v1/score", responses=_ERRORS, operation_id="create_score_v1")
async def create_score(request: ScoreRequest, raw_request: Request) -> ScoreResponse:
    return await raw_request.app.state.serving_score.create_score(request, raw_request)


@router.post("/rerank", responses=_ERRORS, operation_id="do_rerank")
@router.post("/v1/rerank", responses=_ERRORS, operation_id="do_rerank_v1")
@router.post("/v2/rerank", responses=_ERRORS, operation_id="do_rerank_v2")
async def do_rerank(request: RerankRequest, raw_request: Request) -> RerankResponse:
    return await raw_request.app.state.serving_score.do_rerank(request, raw_request)


@router.post("/v1/responses", response_model=ResponseObject, responses={**_ERRORS, **_SSE})
async def create_response(request: ResponsesRequest, raw_request: Request) -> Response:
    return await raw_request.app.state.serving_responses.create_response(request, raw_request)


@router.get(
    "/v1/responses/{response_id}", response_model=ResponseObject, responses={**_ERRORS, **_SSE}
)
async def get_response(
    response_id: str,
    raw_request: Request,
    stream: bool = False,
    starting_after: int | None = None,
) -> Response:
    serving = raw_request.app.state.serving_responses
    return serving.get_response(response_id, stream, starting_after)


@router.get("/v1/responses/{response_id}/input_items", responses=_ERRORS)
async def list_input_items(
    response_id: str,
    raw_request: Request,
    limit: int = 20,
    order: Literal["asc", "desc"] = "desc",
    after: str | None = None,
) -> InputItemList:
    serving = raw_request.app.state.serving_responses
    return serving.list_input_items(response_id, limit, order, after)


@router.delete("/v1/responses/{response_id}", responses=_ERRORS)
async def delete_response(response_id: str, raw_request: Request) -> DeletedResponse:
    return raw_request.app.state.serving_responses.delete_response(response_id)


@router.post("/v1/responses/{response_id}/cancel", responses=_ERRORS)
async def cancel_response(response_id: str, raw_request: Request) -> ResponseObject:
    return raw_request.app.state.serving_responses.cancel_response(response_id)


@router.post(
    "/v1/messages", response_model=MessagesResponse, responses={**_ANTHROPIC_ERRORS, **_SSE}
)
async def create_message(request: MessagesRequest, raw_request: Request) -> Response:
    serving = raw_request.app.state.serving_messages
    return await serving.create_message(request, raw_request)


@router.post("/v1/messages/count_tokens", responses=_ANTHROPIC_ERRORS)
async def count_message_tokens(
    request: CountTokensRequest, raw_request: Request
) -> CountTokensResponse:
    return await raw_request.app.state.serving_messages.count_tokens(request)


@router.post("/tokenize", responses=_ERRORS)
async def tokenize(request: TokenizeRequest, raw_request: Request) -> TokenizeResponse:
    return await raw_request.app.state.serving_tokenization.tokenize(request)


@router.post("/detokenize", responses=_ERRORS)
async def detokenize(request: DetokenizeRequest, raw_request: Request) -> DetokenizeResponse:
    return await raw_request.app.state.serving_tokenization.detokenize(request)


@runtime_lora_router.post(
    "/v1/load_lora_adapter", response_class=PlainTextResponse, responses=_ERRORS
)
async def load_lora_adapter(request: LoadLoRAAdapterRequest, raw_request: Request) -> str:
    models = raw_request.app.state.serving_models
    return await models.load_lora_adapter(request.lora_name, request.lora_path)


@runtime_lora_router.post(
    "/v1/unload_lora_adapter", response_class=PlainTextResponse, responses=_ERRORS
)
async def unload_lora_adapter(request: UnloadLoRAAdapterRequest, raw_request: Request) -> str:
    return await raw_request.app.state.serving_models.unload_lora_adapter(request.lora_name)
