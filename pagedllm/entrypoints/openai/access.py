"""Who may call the server: API keys on /v1 routes and CORS, with vLLM's flags.

`--api-key KEY [KEY ...]` (or PAGEDLLM_API_KEY, as vLLM reads VLLM_API_KEY) makes every /v1
route, and /pooling (a model's raw outputs, which vLLM serves outside /v1), require one of
the keys, sent as `Authorization: Bearer KEY` (OpenAI's clients) or
`x-api-key: KEY` (Anthropic's). `--allowed-origins`, `--allowed-methods`,
`--allowed-headers` (JSON lists, default ["*"]) and `--allow-credentials` configure CORS, so
a browser page on another origin can call the API; preflight requests (OPTIONS) pass the
key check, as browsers send them without credentials.
"""

import argparse
import json
import os
import secrets
from dataclasses import dataclass, field
from http import HTTPStatus

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from pagedllm.entrypoints.openai.errors import error_response

API_KEY_ENV = "PAGEDLLM_API_KEY"


GUARDED_PATHS = ("/pooling",)
"""Routes outside /v1 that need a key too."""


class ApiKeyMiddleware:
    """401 for /v1 (and GUARDED_PATHS) requests without one of the keys; checked before
    the body is read, so a bad key never costs a parse (nor leaks whether the body was
    valid)."""

    def __init__(self, app: ASGIApp, api_keys: list[str]) -> None:
        self.app = app
        self.keys = [key.encode() for key in api_keys]

    def _allowed(self, headers: Headers) -> bool:
        bearer = headers.get("authorization", "")
        given = [bearer.removeprefix("Bearer ") if bearer.startswith("Bearer ") else None]
        given.append(headers.get("x-api-key"))
        # compare_digest for every key and header, so the time taken says nothing
        matches = [secrets.compare_digest(g.encode(), k) for g in given if g for k in self.keys]
        return any(matches)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        guarded = scope["type"] == "http" and (path.startswith("/v1") or path in GUARDED_PATHS)
        if guarded and scope["method"] != "OPTIONS" and not self._allowed(Headers(scope=scope)):
            response = error_response(
                "missing or wrong API key: send the header `Authorization: Bearer <key>` "
                "or `x-api-key: <key>`",
                HTTPStatus.UNAUTHORIZED,
                code="invalid_api_key",
                path=scope["path"],
            )
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


@dataclass(frozen=True)
class CorsConfig:
    allowed_origins: list[str] = field(default_factory=lambda: ["*"])
    allowed_methods: list[str] = field(default_factory=lambda: ["*"])
    allowed_headers: list[str] = field(default_factory=lambda: ["*"])
    allow_credentials: bool = False


def api_keys(given: list[str] | str | None) -> list[str]:
    """The keys from --api-key, else PAGEDLLM_API_KEY; none means an open server."""
    if isinstance(given, str):
        given = [given]
    keys = list(given or [])
    if not keys and os.environ.get(API_KEY_ENV):
        keys = [os.environ[API_KEY_ENV]]
    if any(not key for key in keys):
        raise ValueError("--api-key must not be empty")
    return keys


def add_access_middleware(app: FastAPI, keys: list[str], cors: CorsConfig) -> None:
    """The key check inside CORS, so preflights and 401s carry the CORS headers."""
    if keys:
        app.add_middleware(ApiKeyMiddleware, api_keys=keys)
    app.add_middleware(
        CORSMiddleware,
        allow_origins=cors.allowed_origins,
        allow_methods=cors.allowed_methods,
        allow_headers=cors.allowed_headers,
        allow_credentials=cors.allow_credentials,
    )


def _json_list(text: str) -> list[str]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise argparse.ArgumentTypeError("a JSON list of strings, e.g. '[\"*\"]'")
    return value


def add_access_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--api-key",
        nargs="+",
        default=None,
        help=f"require one of these keys on /v1 routes, as `Authorization: Bearer KEY` or "
        f"`x-api-key: KEY` (default: ${API_KEY_ENV} if set, else none)",
    )
    for name in ("origins", "methods", "headers"):
        parser.add_argument(
            f"--allowed-{name}",
            type=_json_list,
            default=["*"],
            help=f'CORS: allowed {name}, a JSON list (default ["*"])',
        )
    parser.add_argument("--allow-credentials", action="store_true", help="CORS: allow credentials")


def cors_from_args(args: argparse.Namespace) -> CorsConfig:
    return CorsConfig(
        args.allowed_origins, args.allowed_methods, args.allowed_headers, args.allow_credentials
    )
