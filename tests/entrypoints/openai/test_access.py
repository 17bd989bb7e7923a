"""API keys and CORS (pagedllm/entrypoints/openai/access.py). Reference: vLLM's flags and
behaviour: any of several keys, as a Bearer token or x-api-key, guards /v1 routes only;
PAGEDLLM_API_KEY stands in for --api-key; CORS answers preflights with the configured
origins, methods and headers, before the key check."""

import argparse
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from pagedllm import LLM
from pagedllm.engine.async_llm import AsyncLLM
from pagedllm.entrypoints.openai import api_server
from pagedllm.entrypoints.openai.access import CorsConfig, api_keys

BODY = {"model": "m", "prompt": "Hi", "max_tokens": 1}


def client(offline_llm: LLM, **kwargs: object) -> TestClient:
    return TestClient(api_server.build_app(AsyncLLM(offline_llm.llm_engine), ["m"], **kwargs))


@pytest.fixture
def keyed(offline_llm: LLM) -> Iterator[TestClient]:
    cors = CorsConfig(["https://app.example"], ["POST"], ["authorization", "content-type"])
    with client(offline_llm, api_key=["first", "second"], cors=cors) as c:
        yield c


def test_any_key_as_a_bearer_token_or_x_api_key(keyed: TestClient) -> None:
    for headers in (
        {"Authorization": "Bearer first"},
        {"Authorization": "Bearer second"},
        {"x-api-key": "second"},
    ):
        assert keyed.post("/v1/completions", json=BODY, headers=headers).status_code == 200
    for headers in ({}, {"Authorization": "Bearer third"}, {"x-api-key": "Bearer first"}):
        response = keyed.post("/v1/completions", json=BODY, headers=headers)
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "invalid_api_key"
    assert keyed.get("/health").status_code == 200


def test_a_preflight_gets_the_configured_cors_headers_without_a_key(keyed: TestClient) -> None:
    preflight = {
        "Origin": "https://app.example",
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization",
    }
    response = keyed.options("/v1/completions", headers=preflight)
    assert response.status_code == 200
    assert response.headers["access-control-allow-origin"] == "https://app.example"
    assert "POST" in response.headers["access-control-allow-methods"]
    refused = keyed.options("/v1/completions", headers={**preflight, "Origin": "https://x.y"})
    assert refused.status_code == 400
    answer = keyed.post(
        "/v1/completions",
        json=BODY,
        headers={"Origin": "https://app.example", "Authorization": "Bearer first"},
    )
    assert answer.headers["access-control-allow-origin"] == "https://app.example"


def test_the_default_allows_every_origin(offline_llm: LLM) -> None:
    with client(offline_llm) as open_server:
        response = open_server.post("/v1/completions", json=BODY, headers={"Origin": "https://a"})
    assert response.status_code == 200
    assert response.headers["access-control-allow-origin"] == "*"


def test_keys_come_from_the_flag_else_the_environment(monkeypatch) -> None:
    monkeypatch.delenv("PAGEDLLM_API_KEY", raising=False)
    assert api_keys(None) == []
    assert api_keys("k") == ["k"] and api_keys(["a", "b"]) == ["a", "b"]
    monkeypatch.setenv("PAGEDLLM_API_KEY", "from-env")
    assert api_keys(None) == ["from-env"] and api_keys(["flag"]) == ["flag"]
    with pytest.raises(ValueError, match="must not be empty"):
        api_keys([""])


def test_access_flags_parse_as_vllm_spells_them(capsys) -> None:
    parser = argparse.ArgumentParser()
    api_server.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["serve"])
    assert (args.api_key, args.allowed_origins, args.allow_credentials) == (None, ["*"], False)
    args = parser.parse_args(
        [
            "serve",
            "--api-key",
            "a",
            "b",
            "--allowed-origins",
            '["https://x"]',
            "--allow-credentials",
        ]
    )
    assert args.api_key == ["a", "b"] and args.allowed_origins == ["https://x"]
    assert args.allow_credentials is True
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--allowed-methods", "POST"])
    assert "--allowed-methods: not JSON" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--allowed-headers", '{"a": 1}'])
    assert "a JSON list of strings" in capsys.readouterr().err
