"""OpenAI-style errors: `{"error": {"message", "type", "param", "code"}}` for every failure;
Anthropic's `{"type": "error", "error": {"type", "message"}}` under /v1/messages.

Bad input of any kind (malformed JSON, wrong types, out-of-range values, unknown model or
route) answers 4xx with a message naming the field; only a server bug answers 500.
"""

from collections.abc import Iterable
from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from pagedllm.engine.async_llm import EngineDeadError
from pagedllm.entrypoints.openai.anthropic_protocol import anthropic_error_body, is_messages_path
from pagedllm.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
)
from pagedllm.entrypoints.openai.responses import (
    ErrorInfo,
    ErrorResponse,
)
from pagedllm.logger import init_logger

logger = init_logger(__name__)

_MAX_LISTED_ERRORS = 4
# Pydantic's error types at the body's own location that mean it is not a JSON object
# (an array, a scalar, no body at all); other errors there are model validators'.
_NOT_AN_OBJECT = {"model_attributes_type", "model_type", "dict_type", "missing"}
# The fields an engine-side error may name (its message starts with the field's name).
_REQUEST_FIELDS = {*CompletionRequest.model_fields, *ChatCompletionRequest.model_fields}


class OpenAIError(Exception):
    """An error to answer with `status_code` and OpenAI's error body."""

    def __init__(
        self,
        message: str,
        status_code: int = HTTPStatus.BAD_REQUEST,
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = int(status_code)
        self.param = param
        self.code = code


def error_body(
    message: str, status_code: int, param: str | None = None, code: str | None = None
) -> ErrorResponse:
    """Lone surrogates of the client's input that a message quotes are escaped, so the
    body always encodes as UTF-8."""
    kind = "server_error" if status_code >= 500 else "invalid_request_error"
    message, param = _printable(message), _printable(param)
    return ErrorResponse(error=ErrorInfo(message=message, type=kind, param=param, code=code))


def _printable(text: str | None) -> str | None:
    if text is None:
        return None
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def error_response(
    message: str,
    status_code: int,
    param: str | None = None,
    code: str | None = None,
    path: str = "",
) -> JSONResponse:
    """The error in the shape of the API that `path` belongs to."""
    if is_messages_path(path):
        body = anthropic_error_body(_printable(message), status_code)
    else:
        body = error_body(message, status_code, param, code)
    return JSONResponse(body.model_dump(), status_code=status_code)


def invalid_value_error(error: ValueError | TypeError, fields: Iterable[str]) -> OpenAIError:
    """A 400 for a ValueError/TypeError of SamplingParams or the engine. Their messages
    start with the field's name, which becomes `param` when it is one of `fields`."""
    message = str(error)
    first_word = message.split(" ", 1)[0]
    return OpenAIError(message, param=first_word if first_word in set(fields) else None)


def engine_error(error: Exception) -> OpenAIError:
    """The answer to an error raised while a request runs: its own ValueError/TypeError
    is a 400, a dead engine a 503 (the server is about to restart), anything else a 500
    for this request only."""
    if isinstance(error, OpenAIError):
        return error
    if isinstance(error, ValueError | TypeError):
        return invalid_value_error(error, _REQUEST_FIELDS)
    if isinstance(error, EngineDeadError):
        return OpenAIError(str(error), HTTPStatus.SERVICE_UNAVAILABLE, code="engine_dead")
    return OpenAIError(str(error), HTTPStatus.INTERNAL_SERVER_ERROR)


def _validation_message(error: RequestValidationError) -> tuple[str, str | None]:
    """(message, param) for pydantic's errors: each as `field.path: what is wrong`."""
    errors = error.errors()
    if any(e.get("type") == "json_invalid" for e in errors):
        detail = next(e for e in errors if e.get("type") == "json_invalid")
        reason = detail.get("ctx", {}).get("error", "invalid JSON")
        return f"the request body is not valid JSON: {reason}", None
    if errors and tuple(errors[0].get("loc", ())) == ("body",):
        return _body_message(errors[0])
    listed = []
    for e in errors[:_MAX_LISTED_ERRORS]:
        loc = [str(part) for part in _field_path(e)]
        listed.append(f"{'.'.join(loc) or 'body'}: {_error_text(e)}")
    if len(errors) > _MAX_LISTED_ERRORS:
        listed.append(f"and {len(errors) - _MAX_LISTED_ERRORS} more errors")
    first_loc = _field_path(errors[0]) if errors else []
    param = str(first_loc[0]) if first_loc else None
    return "; ".join(listed) or "invalid request", param


def _body_message(error: dict) -> tuple[str, str | None]:
    """(message, param) for an error located at the whole body: the body is not an object,
    or a model validator (a rule across fields) refused it. The validator's message starts
    with the field it is about, which becomes `param` when the body has that field."""
    if error.get("type") in _NOT_AN_OBJECT:
        return "the request body must be a JSON object (Content-Type: application/json)", None
    message = _error_text(error)
    body = error.get("input")
    first_word = message.split(" ", 1)[0]
    return message, first_word if isinstance(body, dict) and first_word in body else None


def _error_text(error: dict) -> str:
    """Pydantic's message, without the "Value error, " it puts before a validator's own."""
    message = error.get("msg", "invalid value")
    return message.removeprefix("Value error, ").removeprefix("Assertion failed, ")


def _field_path(error: dict) -> list:
    """Where a validation error is, without FastAPI's source prefix ("body", "query",
    "path"): the field as the client named it."""
    loc = list(error.get("loc", ()))
    return loc[1:] if loc and loc[0] in ("body", "query", "path") else loc


async def _on_openai_error(request: Request, error: OpenAIError) -> JSONResponse:
    path = request.url.path
    return error_response(error.message, error.status_code, error.param, error.code, path)


async def _on_validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
    message, param = _validation_message(error)
    return error_response(message, HTTPStatus.BAD_REQUEST, param, path=request.url.path)


async def _on_http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
    return error_response(str(error.detail), error.status_code, path=request.url.path)


async def _on_unexpected_error(request: Request, error: Exception) -> JSONResponse:
    path = request.url.path
    if isinstance(error, EngineDeadError):
        status = HTTPStatus.SERVICE_UNAVAILABLE
        return error_response(str(error), status, code="engine_dead", path=path)
    logger.exception("unexpected error while serving a request", exc_info=error)
    message = f"internal server error: {error!r}"
    return error_response(message, HTTPStatus.INTERNAL_SERVER_ERROR, path=path)


def add_exception_handlers(app: FastAPI) -> None:
    app.add_exception_handler(OpenAIError, _on_openai_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    app.add_exception_handler(Exception, _on_unexpected_error)
