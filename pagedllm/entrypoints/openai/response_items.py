"""A stored response's input items as GET /v1/responses/{id}/input_items lists them: each
item of the request's `input` in OpenAI's item shape with an id (the one the client sent,
else a new one), and the page that `limit`, `order` and `after` select."""

from typing import Any, Literal

from pagedllm.entrypoints.openai.errors import OpenAIError
from pagedllm.entrypoints.openai.responses_protocol import (
    FunctionCallItem,
    FunctionCallOutputItem,
    InputItem,
    InputItemList,
    MessageItem,
    ReasoningItem,
    response_id,
)

MAX_LIMIT = 100


def input_items_of(request_input: str | list[InputItem]) -> list[dict[str, Any]]:
    """The input's items in OpenAI's shape (a string is one user message)."""
    if isinstance(request_input, str):
        request_input = [MessageItem(role="user", content=request_input)]
    return [_item(item) for item in request_input]


def _item(item: InputItem) -> dict[str, Any]:
    if isinstance(item, MessageItem):
        kind = "output_text" if item.role == "assistant" else "input_text"
        content = item.content
        if isinstance(content, str):
            content = [{"type": kind, "text": content}]
        else:
            content = [part.model_dump() for part in content]
        if item.role == "assistant":
            content = [{"annotations": [], **part} for part in content]
        fields = {"role": item.role, "content": content}
        return _with_id(item.id, "msg", "message", fields)
    if isinstance(item, FunctionCallItem):
        fields = {"call_id": item.call_id, "name": item.name, "arguments": item.arguments}
        return _with_id(item.id, "fc", "function_call", fields)
    if isinstance(item, FunctionCallOutputItem):
        output = item.output if isinstance(item.output, str) else item.text
        fields = {"call_id": item.call_id, "output": output}
        return _with_id(item.id, "fco", "function_call_output", fields)
    assert isinstance(item, ReasoningItem)
    fields = item.model_dump(include={"summary", "content"})
    return _with_id(item.id, "rs", "reasoning", fields)


def _with_id(item_id: str | None, prefix: str, kind: str, fields: dict) -> dict[str, Any]:
    return {"id": item_id or response_id(prefix), "type": kind, **fields, "status": "completed"}


def page(
    items: list[dict[str, Any]], limit: int, order: Literal["asc", "desc"], after: str | None
) -> InputItemList:
    """`limit` items in `order` (desc: the last input item first), starting after the item
    whose id is `after`; an `after` that names no item is a 400."""
    if not 1 <= limit <= MAX_LIMIT:
        raise OpenAIError(f"limit must be between 1 and {MAX_LIMIT}, got {limit}", param="limit")
    ordered = items if order == "asc" else items[::-1]
    start = 0
    if after is not None:
        ids = [item["id"] for item in ordered]
        if after not in ids:
            raise OpenAIError(
                f"after {after!r} is not an input item of this response", param="after"
            )
        start = ids.index(after) + 1
    data = ordered[start : start + limit]
    return InputItemList(
        data=data,
        first_id=data[0]["id"] if data else None,
        last_id=data[-1]["id"] if data else None,
        has_more=start + limit < len(ordered),
    )
