"""Request and response bodies of POST /v1/embeddings (OpenAI's fields; `normalize` is
vLLM's extra)."""

from typing import Literal

from pydantic import Field

from pagedllm.entrypoints.openai.protocol import OpenAIBaseModel, OpenAIRequestModel, TokenIds

EmbeddingInput = str | list[str] | TokenIds | list[TokenIds]


class EmbeddingRequest(OpenAIRequestModel):
    """`input`: a text, texts, token ids, or lists of token ids (one embedding each);
    `dimensions`: Matryoshka truncation, for models trained for it; `encoding_format`:
    "float" (a JSON list) or "base64" (little-endian float32 bytes, base64, as OpenAI)."""

    input: EmbeddingInput
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None
    normalize: bool | None = None


class EmbeddingResponseData(OpenAIBaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingUsage(OpenAIBaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(OpenAIBaseModel):
    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[EmbeddingResponseData] = Field(default_factory=list)
    usage: EmbeddingUsage
