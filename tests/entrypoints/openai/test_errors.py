"""Bad requests to the running server (pagedllm/entrypoints/openai/errors.py): each gets
the right 4xx with OpenAI's error body naming the field, and the server still answers.
Reference: OpenAI's error format `{"error": {"message", "type", "param", "code"}}`."""

import httpx
import pytest

from tests.entrypoints.openai.remote_server import MODEL_NAME, Server

CHAT = [{"role": "user", "content": "Hi"}]
CMPL, CHAT_CMPL = "/v1/completions", "/v1/chat/completions"

CASES = {
    # id: (path, JSON body or raw bytes, status, param, words in the message)
    "malformed json": (CMPL, b'{"prompt": "hi",', 400, None, "JSON"),
    "not an object": (CMPL, [1, 2], 400, None, "JSON object"),
    "prompt type": (CMPL, {"prompt": 12}, 400, "prompt", "prompt"),
    "max_tokens type": (CMPL, {"prompt": "a", "max_tokens": "x"}, 400, "max_tokens", "integer"),
    "messages type": (CHAT_CMPL, {"messages": "hi"}, 400, "messages", "list"),
    "temperature": (CMPL, {"prompt": "a", "temperature": -1}, 400, "temperature", ">= 0"),
    "top_p": (CHAT_CMPL, {"messages": CHAT, "top_p": 1.5}, 400, "top_p", "(0, 1]"),
    "n": (CMPL, {"prompt": "a", "n": 0}, 400, "n", "at least 1"),
    "penalty": (CMPL, {"prompt": "a", "presence_penalty": 3}, 400, "presence_penalty", "[-2, 2]"),
    "logprobs cap": (CMPL, {"prompt": "a", "logprobs": 21}, 400, "logprobs", "20"),
    "top_logprobs alone": (
        CHAT_CMPL,
        {"messages": CHAT, "top_logprobs": 2},
        400,
        "top_logprobs",
        "logprobs",
    ),
    "top_logprobs cap": (
        CHAT_CMPL,
        {"messages": CHAT, "logprobs": True, "top_logprobs": 21},
        400,
        "top_logprobs",
        "<= 20",
    ),
    "logit_bias id": (CMPL, {"prompt": "a", "logit_bias": {"9999999": 1}}, 400, "logit_bias", ""),
    "token id": (CMPL, {"prompt": [1, 99999999]}, 400, "prompt", "vocabulary"),
    "empty prompt": (CMPL, {"prompt": ""}, 400, "prompt", "empty"),
    "unknown model": (CMPL, {"model": "gpt-9", "prompt": "a"}, 404, "model", "gpt-9"),
    "prompt too long": (CMPL, {"prompt": "word " * 3000}, 400, "prompt", "context length"),
    "max_tokens too many": (
        CHAT_CMPL,
        {"messages": CHAT, "max_tokens": 4000},
        400,
        "max_tokens",
        "2048",
    ),
    "max_completion_tokens too many": (
        CHAT_CMPL,
        {"messages": CHAT, "max_completion_tokens": 4000},
        400,
        "max_completion_tokens",
        "max_completion_tokens",
    ),
    "detokenize id": ("/detokenize", {"tokens": [-1]}, 400, "tokens", "vocabulary"),
    # A model validator's rule across fields: its own message, naming the field.
    "stream_options without stream": (
        CMPL,
        {"prompt": "a", "stream_options": {"include_usage": True}},
        400,
        "stream_options",
        "stream_options can only be set when stream is true",
    ),
    "chat stream_options without stream": (
        CHAT_CMPL,
        {"messages": CHAT, "stream": False, "stream_options": {}},
        400,
        "stream_options",
        "stream_options can only be set when stream is true",
    ),
    "field validator": (
        CMPL,
        {"prompt": "a", "structured_outputs": {"jsn": {}}},
        400,
        "structured_outputs",
        "structured_outputs: unknown fields ['jsn']",
    ),
    "unknown route": ("/v1/nothing", {}, 404, None, "Not Found"),
}


@pytest.mark.parametrize("path, body, status, param, words", CASES.values(), ids=CASES.keys())
def test_bad_request_gets_4xx_and_server_keeps_serving(
    server: Server, path: str, body: object, status: int, param: str | None, words: str
) -> None:
    if isinstance(body, bytes):
        headers = {"Content-Type": "application/json"}
        response = httpx.post(server.url + path, content=body, headers=headers)
    else:
        response = httpx.post(server.url + path, json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert words in error["message"]
    assert "Value error" not in error["message"]  # pydantic's prefix, not the client's concern
    assert httpx.get(server.url + "/health").status_code == 200


def test_good_request_after_bad_ones(server: Server) -> None:
    body = {"model": MODEL_NAME, "prompt": "Hi", "max_tokens": 2}
    assert httpx.post(server.url + "/v1/completions", json=body).status_code == 200
