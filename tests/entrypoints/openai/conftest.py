"""One `pagedllm serve` subprocess on the default model for these tests, the offline `LLM`
(their reference) in the test process, and an OpenAI client of the server."""

from collections.abc import Iterator

import openai
import pytest

from pagedllm import LLM
from tests.entrypoints.openai.remote_server import MAX_MODEL_LEN, Server, remote_server


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    with remote_server() as srv:
        yield srv


@pytest.fixture(scope="session")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="session")
def offline_llm() -> LLM:
    """The reference: the same default model, run offline in this process."""
    return LLM(num_kv_blocks=256, max_model_len=MAX_MODEL_LEN)
