"""Property-based fuzz of the routes in the running server's own /openapi.json (schemathesis):
valid (positive) and invalid (negative) requests, derandomized. Reference: HTTP's contract
that a 5xx is the server's fault, so no request may get one, and /health still answers 200
after the fuzz.

schemathesis' lazy pytest loader (`schemathesis.pytest.from_fixture`) does not run under
pytest 9 (it sets `Function._nodeid`), so each operation's Hypothesis strategy is driven here.
"""

from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from pydantic import TypeAdapter, ValidationError
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.schemas import OpenApiSchema

from tests.entrypoints.openai.remote_server import Server

MAX_EXAMPLES = 25
# Generated bodies are clamped to these, so a fuzzed request generates at most a few tokens.
MAX_TOKENS_CAP, N_CAP = 2, 2
LENGTH_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
TOKEN_LIMITS = {**dict.fromkeys(LENGTH_FIELDS, MAX_TOKENS_CAP), "n": N_CAP}
POST_PATHS = [
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/responses",
    "/v1/embeddings",
    "/v1/score",
    "/v1/rerank",
    "/v1/classify",
    "/pooling",
    "/tokenize",
    "/detokenize",
]
GET_PATHS = ["/health", "/version", "/metrics", "/v1/models", "/v1/responses/{response_id}"]
# A generating route and the field that bounds its answer's length.
GENERATING_PATHS = {
    "/v1/completions": "max_tokens",
    "/v1/chat/completions": "max_tokens",
    "/v1/responses": "max_output_tokens",
}
LAX_INT = TypeAdapter(int)


def as_int(value: Any) -> int | None:
    """The int the server's pydantic models read from `value` (lax mode: 7, 7.0 and "7"
    alike), or None if they refuse it."""
    try:
        return LAX_INT.validate_python(value)
    except ValidationError:
        return None


def cheap_body(path: str, body: Any) -> Any:
    """`body` with a length field (max_tokens, ...) or n that reads as an int over its cap
    (or no token limit at all, which means up to max_model_len) set to the cap; every other
    value, invalid ones included, is kept so that validation is still fuzzed."""
    if path not in GENERATING_PATHS or not isinstance(body, dict):
        return body
    capped = {
        key: TOKEN_LIMITS[key]
        for key, value in body.items()
        if key in TOKEN_LIMITS and (as_int(value) or 0) > TOKEN_LIMITS[key]
    }
    if all(body.get(field) is None for field in LENGTH_FIELDS):
        capped[GENERATING_PATHS[path]] = MAX_TOKENS_CAP
    return {**body, **capped}


def cheap_case(case: schemathesis.Case) -> schemathesis.Case:
    case.body = cheap_body(case.path, case.body)
    return case


@pytest.fixture(scope="module")
def api_schema(server: Server) -> OpenApiSchema:
    """The schema the server serves; failures print bodies unredacted (schemathesis would
    hide max_tokens and other "token" keys as secrets)."""
    config = schemathesis.Config.from_dict({"output": {"sanitization": {"enabled": False}}})
    return schemathesis.openapi.from_url(server.url + "/openapi.json", config=config)


def send(case: schemathesis.Case, server: Server) -> None:
    """Send `case`; a 5xx fails with the request as a curl command to reproduce it."""
    case.call_and_validate(base_url=server.url, checks=[not_a_server_error], timeout=60)


def fuzz(api_schema: OpenApiSchema, server: Server, method: str, path: str, mode: str) -> None:
    """Send MAX_EXAMPLES generated requests to one operation; fail on any 5xx."""
    operation = api_schema[path][method]
    strategy = operation.as_strategy(generation_mode=GenerationMode(mode)).map(cheap_case)

    @settings(
        max_examples=MAX_EXAMPLES,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    @given(case=strategy)
    def check(case: schemathesis.Case) -> None:
        send(case, server)

    check()


@pytest.mark.parametrize("mode", ["positive", "negative"])
@pytest.mark.parametrize("path", POST_PATHS)
def test_post_routes_never_answer_5xx(
    api_schema: OpenApiSchema, server: Server, path: str, mode: str
) -> None:
    fuzz(api_schema, server, "POST", path, mode)


@pytest.mark.parametrize("path", GET_PATHS)
def test_get_routes_never_answer_5xx(api_schema: OpenApiSchema, server: Server, path: str) -> None:
    fuzz(api_schema, server, "GET", path, "positive")


@pytest.mark.parametrize("path", POST_PATHS)
def test_post_routes_edge_cases_never_answer_5xx(
    api_schema: OpenApiSchema, server: Server, path: str
) -> None:
    """schemathesis' coverage phase: each field's boundary values, wrong types, missing
    required fields and unexpected methods, positive and negative, in a fixed order."""
    operation = api_schema[path]["POST"]
    modes, generation = list(GenerationMode), api_schema.config.generation
    cases = api_schema.iter_coverage_cases(
        operation, generation_modes=modes, generation_config=generation
    )
    for case in cases:
        send(cheap_case(case), server)


def test_server_is_healthy_after_the_fuzz(server: Server) -> None:
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200
