"""vLLM's --enable-request-id-headers: every response carries an X-Request-Id header, the
request's own when it sent one, else a new id, so a client or proxy can match answers to
its logs. A new id is also handed to the handler as the request's header, so the response's
`id` and the log lines (serving_engine.py's request_id) carry it as they carry a client's,
unless the body names its own (`request_id`, vLLM's), which a made-up header yields to."""

import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEADER = b"x-request-id"
_MADE_HERE = "request_id_header_made_here"  # the request's state: the header is ours


def header_made_here(raw_request: object) -> bool:
    """Whether the request's X-Request-Id is this middleware's, not its client's."""
    return getattr(getattr(raw_request, "state", None), _MADE_HERE, False)


class RequestIdHeaderMiddleware:
    """Pure ASGI (streamed answers pass through as they are sent)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(HEADER)
        request_id = given or uuid.uuid4().hex.encode()
        if not given:
            state = {**scope.get("state", {}), _MADE_HERE: True}
            scope = {**scope, "headers": [*scope["headers"], (HEADER, request_id)], "state": state}

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != HEADER]
                message = {**message, "headers": [*headers, (HEADER, request_id)]}
            await send(message)

        await self.app(scope, receive, send_with_id)
