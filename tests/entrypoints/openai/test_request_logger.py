"""--enable-log-requests (pagedllm/entrypoints/openai/request_logger.py): one line per
submitted request with its id, prompt, token ids and parameters, cut to --max-log-len;
nothing without the flag. Reference: vLLM's "Received request ..." line."""

import logging
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from pagedllm import LLM
from pagedllm.engine.async_llm import AsyncLLM
from pagedllm.entrypoints.openai import api_server
from pagedllm.entrypoints.openai.request_logger import RequestLogger


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
    RequestLogger().log("r2", {"prompt_token_ids": [7, 8]}, "Q")
    assert lines == [
        "Received request r1: prompt: 'abcd', params: 'P', prompt_token_ids: [1, 2, 3, 4]",
        "Received request r2: prompt: None, params: 'Q', prompt_token_ids: [7, 8]",
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
