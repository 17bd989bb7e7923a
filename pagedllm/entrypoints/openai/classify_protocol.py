"""Request and response bodies of vLLM's classification API (POST /classify, and
/v1/classify as SGLang and clients call it): vLLM's ClassificationCompletionRequest and
ClassificationChatRequest in one body (PoolingPromptRequest's `input` or `messages`)."""

from typing import Literal

from pagedllm.entrypoints.openai.embedding_protocol import PoolingPromptRequest
from pagedllm.entrypoints.openai.protocol import OpenAIBaseModel
from pagedllm.entrypoints.openai.responses import UsageInfo


class ClassificationRequest(PoolingPromptRequest):
    """Each prompt's label scores (PoolingPromptRequest's prompts); `use_activation`: False gives
    the score head's raw logits, None or True the model's activation (softmax, sigmoid,
    ...)."""

    use_activation: bool | None = None


class ClassificationData(OpenAIBaseModel):
    """`probs`: the labels' scores (after the activation unless it was turned off);
    `label`: the best label's name (id2label's; null where the model names none)."""

    index: int
    label: str | None
    probs: list[float]
    num_classes: int


class ClassificationResponse(OpenAIBaseModel):
    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[ClassificationData]
    usage: UsageInfo
