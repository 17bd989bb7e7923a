"""Posting to an in-process app (fastapi's TestClient over build_app): the JSON answer, or a
stream's chunks; an app over an LLM of the given engine arguments."""

import json
from collections.abc import Iterator

from fastapi.testclient import TestClient

from pagedllm import LLM
from pagedllm.engine.async_llm import AsyncLLM
from pagedllm.entrypoints.openai import api_server
from pagedllm.entrypoints.openai.request_logger import RequestLogger


def app_over(
    folder: str,
    model_name: str,
    request_logger: RequestLogger | None = None,
    chat_template: str | None = None,
    **engine_args: object,
) -> Iterator[TestClient]:
    """Yields a client of a server of `folder` (as `model_name`, with `chat_template` as
    its --chat-template), then closes its LLM."""
    llm = LLM(folder, **engine_args)
    app = api_server.build_app(
        AsyncLLM(llm.llm_engine),
        [model_name],
        chat_template=chat_template,
        request_logger=request_logger,
    )
    with TestClient(app) as http:
        yield http
    llm.close()


def post(http: TestClient, path: str, body: dict, headers: dict | None = None) -> dict | list:
    """The JSON answer, or with `stream` the chunks' JSON objects in order."""
    response = http.post(path, json=body, headers=headers)
    assert response.status_code == 200, response.text
    if not body.get("stream"):
        return response.json()
    lines = response.text.splitlines()
    return [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
