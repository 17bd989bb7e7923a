"""One `pagedllm serve` subprocess on the default model for these tests, and an OpenAI
client of the server; the offline `LLM` (their reference) is tests/entrypoints/conftest.py's."""

from collections.abc import Iterator

import openai
import pytest

from tests.entrypoints.openai.remote_server import Server, remote_server


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    with remote_server() as srv:
        yield srv


@pytest.fixture(scope="session")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
