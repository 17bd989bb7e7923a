"""pagedllm/entrypoints/openai/unsupported_fields.py. References: OpenAI's and vLLM's request
schemas (a field pagedllm does not implement is a 400 naming it unless its value asks for
nothing; fields that change no output are accepted) and vLLM's handling of unknown fields
(logged, ignored)."""

import logging

import pytest

from pagedllm.entrypoints.openai.classify_protocol import ClassificationRequest
from pagedllm.entrypoints.openai.embedding_protocol import EmbeddingRequest
from pagedllm.entrypoints.openai.errors import OpenAIError
from pagedllm.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from pagedllm.entrypoints.openai.score_protocol import RerankRequest, ScoreRequest
from pagedllm.entrypoints.openai.unsupported_fields import (
    IGNORED_FIELDS,
    check_unsupported_fields,
    refused_fields,
)

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("endpoint", "field", "value"),
    [
        ("chat", "functions", [{"name": "f"}]),
        ("chat", "modalities", ["text", "audio"]),
        ("chat", "best_of", 2),
        ("chat", "guided_json", {"type": "object"}),
        ("chat", "echo", True),
        ("completion", "suffix", "x"),
        ("completion", "best_of", True),
        ("embedding", "return_token_ids", True),
        ("embedding", "request_id", "abc"),
        ("embedding", "chat_template", "{{ 1 }}"),
        ("classify", "softmax", False),
        ("classify", "activation", True),
        ("classify", "priority", 1),
    ],
)
def test_refused_fields_are_a_400_naming_them(endpoint: str, field: str, value: object) -> None:
    with pytest.raises(OpenAIError, match=f"^{field} is not supported by pagedllm") as error:
        check_unsupported_fields({field: value}, endpoint)
    assert error.value.param == field and error.value.status_code == 400


def test_values_that_ask_for_nothing_and_ignored_fields_pass(
    caplog: pytest.LogCaptureFixture,
) -> None:
    noops = {"best_of": 1, "modalities": ["text"], "echo": None}
    ignored = dict.fromkeys(IGNORED_FIELDS, "x")
    with caplog.at_level(logging.WARNING):
        check_unsupported_fields(noops | ignored, "chat")
        check_unsupported_fields({"add_special_tokens": True}, "completion")
    assert not caplog.records
    with caplog.at_level(logging.WARNING):
        check_unsupported_fields({"brand_new_field": 1}, "chat")
    assert "['brand_new_field'] are unknown and ignored" in caplog.text


def test_no_refused_field_is_one_the_server_implements() -> None:
    """A field declared by a request body never reaches this check (it is not extra)."""
    for endpoint, model in (
        ("chat", ChatCompletionRequest),
        ("completion", CompletionRequest),
        ("embedding", EmbeddingRequest),
        ("classify", ClassificationRequest),
        ("classify", ScoreRequest),
        ("classify", RerankRequest),
    ):
        assert not set(refused_fields(endpoint)) & set(model.model_fields)
        assert not IGNORED_FIELDS & set(model.model_fields)
    extra = ChatCompletionRequest(messages=MESSAGES, functions=[], n=2).model_extra
    assert extra == {"functions": []}
