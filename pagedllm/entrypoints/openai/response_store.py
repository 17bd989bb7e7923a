"""ResponseStore: the server's stored responses (`store: true`), for GET and DELETE
/v1/responses/{id}, its input items, and `previous_response_id`.

It lives in memory, bounded by --max-stored-responses: storing one more evicts the least
recently stored or read. A response id it does not hold (never stored, deleted or
evicted) is a 404 in OpenAI's error shape.
"""

from collections import OrderedDict
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from pagedllm.entrypoints.openai.errors import OpenAIError
from pagedllm.entrypoints.openai.protocol import ChatMessage
from pagedllm.entrypoints.openai.response_events import ResponseEvents
from pagedllm.entrypoints.openai.responses_protocol import ResponseObject

DEFAULT_MAX_STORED_RESPONSES = 1000


@dataclass
class StoredResponse:
    """A response and its conversation as chat messages: the input (and the earlier
    responses it continues) and its output, without its instructions, which OpenAI's
    API does not carry over to the next response; and the request's input items as
    GET /v1/responses/{id}/input_items lists them (response_items.py); and for a
    background streamed response, its events (response_events.py), which live as long
    as it does."""

    response: ResponseObject
    conversation: list[ChatMessage]
    input_items: list[dict[str, Any]] = field(default_factory=list)
    events: ResponseEvents | None = None


class ResponseStore:
    def __init__(self, max_size: int = DEFAULT_MAX_STORED_RESPONSES) -> None:
        if max_size < 0:
            raise ValueError(f"--max-stored-responses must be >= 0, got {max_size}")
        self.max_size = max_size
        self._responses: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._responses)

    def put(self, stored: StoredResponse) -> None:
        self._responses[stored.response.id] = stored
        self._responses.move_to_end(stored.response.id)
        while len(self._responses) > self.max_size:
            self._responses.popitem(last=False)

    def get(self, response_id: str, param: str | None = None) -> StoredResponse:
        """The stored response (now the most recently used); a 404 naming `param` if the
        store does not hold it."""
        stored = self._responses.get(response_id)
        if stored is None:
            raise _not_found(response_id, param)
        self._responses.move_to_end(response_id)
        return stored

    def peek(self, response_id: str) -> StoredResponse | None:
        """The stored response without counting a use (None if not held)."""
        return self._responses.get(response_id)

    def delete(self, response_id: str) -> None:
        if self._responses.pop(response_id, None) is None:
            raise _not_found(response_id, None)


def _not_found(response_id: str, param: str | None) -> OpenAIError:
    return OpenAIError(
        f"Response with id {response_id!r} not found (never stored, deleted, or evicted: "
        "the server keeps the --max-stored-responses most recently used)",
        HTTPStatus.NOT_FOUND,
        param=param,
    )
