"""ResponseStore of pagedllm/entrypoints/openai/response_store.py: least-recently-used
eviction (reference: functools.lru_cache's order: a read refreshes an entry), 404s in
OpenAI's error shape, and a server started with --max-stored-responses 1."""

import openai
import pytest

from pagedllm.entrypoints.openai.errors import OpenAIError
from pagedllm.entrypoints.openai.response_store import ResponseStore, StoredResponse
from pagedllm.entrypoints.openai.responses_protocol import ResponseObject
from tests.entrypoints.openai.remote_server import MODEL_NAME, remote_server


def stored(response_id: str) -> StoredResponse:
    return StoredResponse(ResponseObject(id=response_id, model="m"), conversation=[])


def test_the_least_recently_used_goes_first() -> None:
    store = ResponseStore(max_size=2)
    store.put(stored("a"))
    store.put(stored("b"))
    assert store.get("a").response.id == "a"  # "b" is now the least recently used
    store.put(stored("c"))
    assert len(store) == 2 and store.get("c") and store.get("a")
    with pytest.raises(OpenAIError, match="'b' not found") as error:
        store.get("b", "previous_response_id")
    assert error.value.status_code == 404 and error.value.param == "previous_response_id"


def test_delete_and_bounds() -> None:
    store = ResponseStore(max_size=0)
    store.put(stored("a"))
    assert len(store) == 0
    with pytest.raises(OpenAIError, match="'a' not found"):
        store.delete("a")
    with pytest.raises(ValueError, match="--max-stored-responses must be >= 0, got -1"):
        ResponseStore(max_size=-1)


def test_a_server_keeping_one_response_evicts_the_one_before() -> None:
    with remote_server("--max-stored-responses", "1") as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        ask = dict(model=MODEL_NAME, max_output_tokens=2, temperature=0)
        first = client.responses.create(input="One", **ask)
        second = client.responses.create(input="Two", previous_response_id=first.id, **ask)
        assert client.responses.retrieve(second.id).id == second.id
        with pytest.raises(openai.NotFoundError, match=first.id) as error:
            client.responses.create(input="Three", previous_response_id=first.id, **ask)
        assert error.value.body["type"] == "invalid_request_error"
        assert error.value.body["param"] == "previous_response_id"
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(first.id)
