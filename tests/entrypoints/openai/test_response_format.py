"""OpenAI's `response_format` and vLLM's `structured_outputs` body field
(pagedllm/entrypoints/openai/response_format.py), unit by unit and through the running
server with the official `openai` client. References: the client's own `parse` (it checks
the answer against the pydantic model it sent), json.loads and jsonschema, OpenAI's error
body for bad requests."""

import json
from typing import Literal

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from pagedllm.entrypoints.openai.protocol import CompletionRequest
from pagedllm.sampling_params import StructuredOutputsParams
from tests.entrypoints.openai.remote_server import MODEL_NAME, Server

CHAT = [{"role": "user", "content": "Describe a person as JSON."}]
SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "maximum": 9}},
    "required": ["ok", "n"],
    "additionalProperties": False,
}


class Person(BaseModel):
    name: str = Field(min_length=1, max_length=10)
    age: int = Field(ge=0, le=99)
    pets: list[Literal["cat", "dog"]] = Field(max_length=2)


def params_of(**body: object):  # noqa: ANN201 - StructuredOutputsParams | None
    return CompletionRequest(prompt="a", **body).sampling_params(8, None).structured_outputs


def test_each_response_format_asks_for_its_constraint() -> None:
    json_schema = {"name": "x", "schema": SCHEMA, "strict": True}
    assert params_of(response_format={"type": "text"}) is None
    assert params_of(response_format={"type": "json_object"}).json_object is True
    assert params_of(response_format={"type": "json_schema", "json_schema": json_schema}).json == (
        SCHEMA
    )
    so = params_of(structured_outputs={"choice": ["a", "b"]})
    assert so == StructuredOutputsParams(choice=["a", "b"])
    assert params_of(response_format={"type": "text"}, structured_outputs={"regex": "a"}).regex


@pytest.mark.parametrize(
    "body, message",
    [
        (
            {"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}},
            "response_format and structured_outputs both",
        ),
        ({"response_format": {"type": "json_schema"}}, "needs json_schema.schema"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "needs json_schema.schema",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {
                        "name": "x",
                        "schema": {"type": "object", "minProperties": "a"},
                    },
                }
            },
            "response_format has an unsupported or invalid JSON schema",
        ),
    ],
)
def test_bad_response_formats_name_the_field(body: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        params_of(**body)


def post(server: Server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json={"model": MODEL_NAME, **body}, timeout=60)


# Through the server.


def test_parse_returns_the_pydantic_object(client: openai.OpenAI) -> None:
    completion = client.chat.completions.parse(
        model=MODEL_NAME,
        messages=CHAT,
        response_format=Person,
        temperature=0,
        max_completion_tokens=64,
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, Person)


def answer(client: openai.OpenAI, endpoint: str, response_format: dict) -> tuple[str, str]:
    """(text, finish_reason) of a greedy answer on /v1/chat/completions or /v1/completions."""
    common = {"model": MODEL_NAME, "temperature": 0, "max_tokens": 64}
    if endpoint == "chat":
        messages = [{"role": "user", "content": "Give a JSON object with the keys a and b."}]
        chat = client.chat.completions.create(
            messages=messages, response_format=response_format, **common
        )
        return chat.choices[0].message.content, chat.choices[0].finish_reason
    completion = client.completions.create(
        prompt="A person as JSON:", extra_body={"response_format": response_format}, **common
    )
    return completion.choices[0].text, completion.choices[0].finish_reason


@pytest.mark.parametrize("endpoint", ["chat", "completion"])
def test_json_object_and_json_schema_on_both_endpoints(
    client: openai.OpenAI, endpoint: str
) -> None:
    formats = [
        ({"type": "json_object"}, {"type": "object"}),
        ({"type": "json_schema", "json_schema": {"name": "flag", "schema": SCHEMA}}, SCHEMA),
    ]
    for response_format, schema in formats:
        text, finish_reason = answer(client, endpoint, response_format)
        assert finish_reason == "stop", text
        jsonschema.validate(json.loads(text), schema)


def test_structured_outputs_body_field_and_streaming(client: openai.OpenAI) -> None:
    """vLLM's extra body field, streamed: the pieces add up to an answer that matches."""
    stream = client.completions.create(
        model=MODEL_NAME,
        prompt="The capital of France is",
        extra_body={"structured_outputs": {"choice": [" Paris", " London"]}},
        temperature=1.0,
        seed=3,
        n=2,
        max_tokens=8,
        stream=True,
    )
    texts = {0: "", 1: ""}
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
    assert set(texts.values()) <= {" Paris", " London"}


BAD_REQUESTS = {
    # id: (path, body, param, words in the message)
    "unknown type": (
        "/v1/chat/completions",
        {"messages": CHAT, "response_format": {"type": "xml"}},
        "response_format",
        "response_format.type",
    ),
    "invalid schema": (
        "/v1/chat/completions",
        {
            "messages": CHAT,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "integr"}},
            },
        },
        "response_format",
        "invalid JSON schema",
    ),
    "invalid regex": (
        "/v1/completions",
        {"prompt": "a", "structured_outputs": {"regex": "[0-9"}},
        "structured_outputs",
        "invalid regex",
    ),
    "two kinds": (
        "/v1/completions",
        {"prompt": "a", "structured_outputs": {"regex": "a", "choice": ["a"]}},
        "structured_outputs",
        "['regex', 'choice']",
    ),
}


@pytest.mark.parametrize("path, body, param, words", BAD_REQUESTS.values(), ids=BAD_REQUESTS)
def test_bad_constraints_are_400_naming_them(
    server: Server, path: str, body: dict, param: str, words: str
) -> None:
    response = post(server, path, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert words in error["message"]
