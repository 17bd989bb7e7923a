"""Request and response bodies of vLLM's generic pooling API, POST /pooling: vLLM's
PoolingCompletionRequest and PoolingChatRequest in one body (PoolingPromptRequest's `input`
or `messages`), and its PoolingResponse."""

from typing import Literal

from pagedllm.entrypoints.openai.embedding_protocol import PoolingPromptRequest
from pagedllm.entrypoints.openai.protocol import OpenAIBaseModel
from pagedllm.entrypoints.openai.responses import UsageInfo


class PoolingRequest(PoolingPromptRequest):
    """Each prompt's raw pooler output (PoolingPromptRequest's prompts). `task`: vLLM's
    pooling task ("embed", "classify", "score" or "token_classify", one of the model's;
    null: its first); `dimensions` and `normalize`: an embedding's, `use_activation`: a
    classifier's (PoolingParams'); `encoding_format`: "float" (JSON numbers) or "base64"
    (the little-endian float32 bytes of the flattened output, base64)."""

    task: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    normalize: bool | None = None
    use_activation: bool | None = None


class PoolingResponseData(OpenAIBaseModel):
    """`data`: a vector (embed, classify, score) or one row per prompt token
    (token_classify), or its base64."""

    index: int
    object: Literal["pooling"] = "pooling"
    data: list[list[float]] | list[float] | str


class PoolingResponse(OpenAIBaseModel):
    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[PoolingResponseData]
    usage: UsageInfo
