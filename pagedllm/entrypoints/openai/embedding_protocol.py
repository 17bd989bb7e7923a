"""Request and response bodies of POST /v1/embeddings (OpenAI's fields; `normalize`,
`truncate_prompt_tokens`, `add_special_tokens` and the chat form's `messages` are vLLM's
extras), and PoolingPromptRequest, the prompt fields it shares with /classify
(classify_protocol.py)."""

from typing import Literal

from pydantic import ConfigDict, Field

from pagedllm.entrypoints.openai.protocol import (
    ChatMessage,
    ChatTemplateFields,
    OpenAIBaseModel,
    TokenIds,
    ToolChoice,
)

PoolingInput = str | list[str] | TokenIds | list[TokenIds]


class PoolingPromptRequest(ChatTemplateFields):
    """A pooling request's prompts, in vLLM's two forms: `input`, a text, texts, token ids,
    or lists of token ids (one result each), or `messages` (one result of the conversation
    through the chat template, with the template fields chat takes);
    `truncate_prompt_tokens`: keep each prompt's last N tokens (-1: the model's context
    length), as vLLM; `add_special_tokens`: the tokenizer's (BOS, EOS) around a text, by
    default True for `input` and False for `messages` (the template places them)."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)  # refused fields: a 400

    input: PoolingInput | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    model: str | None = None
    user: str | None = None
    truncate_prompt_tokens: int | None = Field(None, ge=-1)
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = False  # vLLM's default for a pooled conversation
    tool_choice: ToolChoice | None = None


class EmbeddingRequest(PoolingPromptRequest):
    """One embedding per prompt (PoolingPromptRequest); `dimensions`: Matryoshka truncation, for
    models trained for it; `encoding_format`: "float" (a JSON list) or "base64"
    (little-endian float32 bytes, base64, as OpenAI)."""

    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
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
