"""--enable-log-requests (pagedllm/entrypoints/openai/request_logger.py): one line per
submitted request with its id (the one the client sees), prompt, token ids and parameters,
cut to --max-log-len, and one per request aborted unfinished; nothing without the flag.
Reference: vLLM's "Received request ..." and "Aborted request ..." lines, and its request
ids (the client's X-Request-Id as their base)."""

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator

import pytest
from fastapi.testclient import TestClient

from pagedllm import LLM
from pagedllm.engine.async_llm import AsyncLLM
from pagedllm.entrypoints.openai import api_server
from pagedllm.entrypoints.openai.request_logger import RequestLogger
from pagedllm.lora.request import LoRARequest
from pagedllm.outputs import CompletionOutput, RequestOutput


@pytest.fixture
def lines() -> Iterator[list[str]]:
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    logger = logging.getLogger("pagedllm.requests")
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)


def test_a_line_per_request_cut_to_max_log_len(lines: list[str]) -> None:
    RequestLogger(max_log_len=4).log(
        "r1", {"prompt": "abcdefgh", "prompt_token_ids": [1, 2, 3, 4, 5]}, "P"
    )
    RequestLogger().log("r2", {"prompt_token_ids": [7, 8]}, "Q", LoRARequest("sql", 1, "/a"))
    assert lines == [
        "Received request r1: prompt: 'abcd', params: 'P', prompt_token_ids: [1, 2, 3, 4], "
        "lora_request: None",
        "Received request r2: prompt: None, params: 'Q', prompt_token_ids: [7, 8], "
        "lora_request: LoRARequest(lora_name='sql', lora_int_id=1, lora_path='/a', "
        "base_model_name=None)",
    ]


@pytest.mark.parametrize("enabled", [True, False])
def test_the_server_logs_what_it_submits_only_when_asked(
    offline_llm: LLM, lines: list[str], enabled: bool
) -> None:
    logger = RequestLogger(max_log_len=3) if enabled else None
    app = api_server.build_app(AsyncLLM(offline_llm.llm_engine), ["m"], request_logger=logger)
    with TestClient(app) as client:
        body = {"prompt": "Hello there", "max_tokens": 1}
        assert client.post("/v1/completions", json=body).status_code == 200
        chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
        assert client.post("/v1/chat/completions", json=chat).status_code == 200
    if not enabled:
        assert lines == []
        return
    assert len(lines) == 2
    assert lines[0].startswith("Received request cmpl-") and "prompt: 'Hel'" in lines[0]
    assert lines[1].startswith("Received request chatcmpl-") and "max_tokens=1" in lines[1]
    assert "prompt: '<|i'" in lines[1], "chat's line holds its templated prompt"


def test_the_logged_id_is_the_one_the_client_sees(offline_llm: LLM, lines: list[str]) -> None:
    """A client's X-Request-Id is the id's base (vLLM's `cmpl-<header>`, and `-N` for the
    Nth prompt); a response is logged under its `resp_...` id."""
    app = api_server.build_app(
        AsyncLLM(offline_llm.llm_engine), ["m"], request_logger=RequestLogger()
    )
    with TestClient(app) as client:
        body = {"prompt": ["Hello", "there"], "max_tokens": 1}
        headers = {"X-Request-Id": "abc"}
        completion = client.post("/v1/completions", json=body, headers=headers).json()
        chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
        headers = {"X-Request-Id": "xyz"}
        chat_completion = client.post("/v1/chat/completions", json=chat, headers=headers).json()
        body = {"input": "Hi", "max_output_tokens": 1, "store": False}
        response = client.post("/v1/responses", json=body).json()
    assert completion["id"] == "cmpl-abc" and chat_completion["id"] == "chatcmpl-xyz"
    assert response["id"].startswith("resp_")
    ids = [line.split(":")[0].removeprefix("Received request ") for line in lines]
    assert ids == ["cmpl-abc-0", "cmpl-abc-1", "chatcmpl-xyz", response["id"]]


async def _outputs(finishes: list[bool]) -> AsyncIterator[RequestOutput]:
    for finished in finishes:
        yield RequestOutput("r", None, [1], None, [CompletionOutput(0, "", [2])], finished)


def test_a_request_abandoned_unfinished_is_logged_as_aborted(lines: list[str]) -> None:
    """Closed or cancelled before its last output (the client went away): "Aborted
    request <id>.", as vLLM logs it; closed after it, nothing."""

    async def take_first_then_close(finishes: list[bool]) -> None:
        watched = RequestLogger().watch("r", _outputs(finishes))
        await anext(watched)
        await watched.aclose()

    async def cancel_while_waiting() -> None:
        async def never() -> AsyncIterator[RequestOutput]:
            await asyncio.sleep(60)
            yield  # pragma: no cover

        task = asyncio.create_task(anext(RequestLogger().watch("s", never())))
        await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(take_first_then_close([False, True]))
    asyncio.run(take_first_then_close([True]))
    asyncio.run(cancel_while_waiting())
    assert lines == ["Aborted request r.", "Aborted request s."]
