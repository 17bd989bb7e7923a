"""RequestSizeLimitMiddleware (pagedllm/entrypoints/openai/request_size.py) on a small app:
a body over the limit gets 413 with OpenAI's error body whether its size is declared
(Content-Length) or only counted as it arrives (chunked); smaller bodies pass untouched."""

from collections.abc import Iterator

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import BaseModel

from pagedllm.entrypoints.openai.errors import add_exception_handlers
from pagedllm.entrypoints.openai.request_size import RequestSizeLimitMiddleware

LIMIT = 1000
JSON = {"Content-Type": "application/json"}


class Body(BaseModel):
    text: str


@pytest.fixture
def client() -> Iterator[TestClient]:
    app = FastAPI()
    add_exception_handlers(app)
    app.add_middleware(RequestSizeLimitMiddleware, max_bytes=LIMIT)

    @app.post("/echo")
    async def echo(body: Body) -> dict:
        return {"length": len(body.text)}

    with TestClient(app) as test_client:
        yield test_client


def body_of(size: int) -> bytes:
    """A JSON body of exactly `size` bytes."""
    return b'{"text": "' + b"a" * (size - 12) + b'"}'


def assert_413(response) -> None:  # noqa: ANN001 - an httpx response
    assert response.status_code == 413, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert f"limit of {LIMIT} bytes" in error["message"]


def test_body_at_the_limit_passes(client: TestClient) -> None:
    response = client.post("/echo", content=body_of(LIMIT), headers=JSON)
    assert response.status_code == 200 and response.json() == {"length": LIMIT - 12}


def test_declared_size_over_the_limit_gets_413(client: TestClient) -> None:
    assert_413(client.post("/echo", content=body_of(LIMIT + 1), headers=JSON))


def test_chunked_body_over_the_limit_gets_413(client: TestClient) -> None:
    def chunks() -> Iterator[bytes]:
        body = body_of(3 * LIMIT)
        for start in range(0, len(body), 100):
            yield body[start : start + 100]

    assert_413(client.post("/echo", content=chunks(), headers=JSON))


def test_limit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_request_bytes"):
        RequestSizeLimitMiddleware(FastAPI(), max_bytes=0)
