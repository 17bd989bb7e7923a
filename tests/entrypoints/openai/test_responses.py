"""pagedllm/entrypoints/openai/responses.py. Reference: OpenAI's response formats as its
official `openai` client parses them (object names, id prefixes, usage totals, error body)."""

import openai.types as oai
import openai.types.chat as oai_chat

from pagedllm.entrypoints.openai.responses import (
    AssistantMessage,
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatCompletionResponseStreamChoice,
    ChatCompletionStreamResponse,
    CompletionResponse,
    CompletionResponseChoice,
    DeltaMessage,
    ErrorInfo,
    ErrorResponse,
    ModelCard,
    ModelList,
    UsageInfo,
)


def test_usage_total_is_prompt_plus_completion() -> None:
    usage = UsageInfo.of(prompt_tokens=7, completion_tokens=5)
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (7, 5, 12)


def test_completion_response_parses_as_openais() -> None:
    choice = CompletionResponseChoice(index=0, text="hi", finish_reason="length")
    ours = CompletionResponse(model="m", choices=[choice], usage=UsageInfo.of(3, 1))
    theirs = oai.Completion.model_validate(ours.model_dump())
    assert theirs.object == "text_completion" and theirs.id.startswith("cmpl-")
    assert theirs.choices[0].text == "hi" and theirs.usage.total_tokens == 4


def test_chat_responses_parse_as_openais() -> None:
    choice = ChatCompletionResponseChoice(
        index=0, message=AssistantMessage(content="hello"), finish_reason="stop"
    )
    ours = ChatCompletionResponse(model="m", choices=[choice], usage=UsageInfo.of(2, 1))
    theirs = oai_chat.ChatCompletion.model_validate(ours.model_dump())
    assert theirs.object == "chat.completion" and theirs.id.startswith("chatcmpl-")
    assert theirs.choices[0].message.role == "assistant"
    chunk = ChatCompletionStreamResponse(
        id=ours.id,
        model="m",
        choices=[ChatCompletionResponseStreamChoice(index=0, delta=DeltaMessage(role="assistant"))],
    )
    parsed = oai_chat.ChatCompletionChunk.model_validate(chunk.model_dump())
    assert parsed.object == "chat.completion.chunk" and parsed.id == ours.id


def test_ids_are_unique_per_response() -> None:
    ids = {CompletionResponse(model="m", choices=[]).id for _ in range(100)}
    assert len(ids) == 100


def test_model_list_parses_as_openais() -> None:
    ours = ModelList(data=[ModelCard(id="m", max_model_len=2048)])
    theirs = oai.Model.model_validate(ours.model_dump()["data"][0])
    assert (theirs.id, theirs.object, theirs.owned_by) == ("m", "model", "pagedllm")


def test_error_body_has_openais_four_fields() -> None:
    body = ErrorResponse(error=ErrorInfo(message="bad", type="invalid_request_error"))
    assert body.model_dump() == {
        "error": {"message": "bad", "type": "invalid_request_error", "param": None, "code": None}
    }
