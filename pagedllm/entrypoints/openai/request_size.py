"""RequestSizeLimitMiddleware: 413 for a request body over --max-request-bytes, before any
of it is parsed, so a huge body costs neither memory nor event-loop time."""

from http import HTTPStatus

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pagedllm.entrypoints.openai.errors import error_response

DEFAULT_MAX_REQUEST_BYTES = 32 * 1024 * 1024


class RequestTooLarge(HTTPException):
    """Raised from the app's receive() when a chunked body passes the limit: an
    HTTPException, which FastAPI's body parsing re-raises to the app's error handler."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, _message(max_bytes))


def _message(max_bytes: int) -> str:
    return (
        f"the request body is larger than the server's limit of {max_bytes} bytes "
        "(--max-request-bytes)"
    )


class RequestSizeLimitMiddleware:
    """A declared Content-Length over the limit is refused at once; a body without one
    (chunked) is counted as it arrives and refused once it passes the limit."""

    def __init__(self, app: ASGIApp, max_bytes: int = DEFAULT_MAX_REQUEST_BYTES) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_request_bytes must be >= 1, got {max_bytes}")
        self.app = app
        self.max_bytes = max_bytes

    def _too_large(self, path: str) -> JSONResponse:
        status = HTTPStatus.REQUEST_ENTITY_TOO_LARGE
        return error_response(_message(self.max_bytes), status, path=path)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await self._too_large(scope["path"])(scope, receive, send)
            return
        received = 0
        response_started = False

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise RequestTooLarge(self.max_bytes)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal response_started
            response_started |= message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except RequestTooLarge:
            if response_started:
                raise
            await self._too_large(scope["path"])(scope, receive, send)
