"""pagedllm/entrypoints/openai/response_items.py. Reference: OpenAI's input item list
(GET /v1/responses/{id}/input_items): items in OpenAI's shapes with ids, `order` desc by
default (the last item first), `after` an item id, `limit` 1..100, `has_more`."""

import pytest

from pagedllm.entrypoints.openai.errors import OpenAIError
from pagedllm.entrypoints.openai.response_items import input_items_of, page
from pagedllm.entrypoints.openai.responses_protocol import ResponsesRequest


def items(n: int) -> list[dict]:
    return [{"id": f"i{k}"} for k in range(n)]


def ids(listed) -> list[str]:
    return [item["id"] for item in listed.data]


def test_a_string_is_one_user_message_with_an_input_text_part() -> None:
    (item,) = input_items_of("Hi")
    assert item["id"].startswith("msg_")
    assert item == {
        "id": item["id"],
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "Hi"}],
        "status": "completed",
    }


def test_items_keep_the_ids_sent_and_take_openais_shapes() -> None:
    request = ResponsesRequest(
        input=[
            {"role": "system", "content": "Be brief."},
            {"type": "message", "id": "msg_a", "role": "assistant", "content": "Ok."},
            {
                "type": "function_call",
                "id": "fc_1",
                "call_id": "c1",
                "name": "f",
                "arguments": "{}",
            },
            {
                "type": "function_call_output",
                "call_id": "c1",
                "output": [{"type": "input_text", "text": "4"}],
            },
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "hm"}]},
        ]
    )
    system, assistant, call, output, reasoning = input_items_of(request.input)
    assert system["content"] == [{"type": "input_text", "text": "Be brief."}]
    assert assistant["id"] == "msg_a"
    assert assistant["content"] == [{"annotations": [], "type": "output_text", "text": "Ok."}]
    assert (call["id"], call["type"], call["call_id"], call["name"]) == (
        "fc_1",
        "function_call",
        "c1",
        "f",
    )
    assert (output["type"], output["output"]) == ("function_call_output", "4")
    assert output["id"].startswith("fco_")
    assert reasoning["summary"] == [{"type": "summary_text", "text": "hm"}]
    assert reasoning["id"].startswith("rs_")
    assert all(item["status"] == "completed" for item in (system, call, output))


def test_page_orders_limits_and_pages_after_an_id() -> None:
    five = items(5)
    first = page(five, 2, "desc", None)
    assert ids(first) == ["i4", "i3"]
    assert (first.first_id, first.last_id, first.has_more) == ("i4", "i3", True)
    assert ids(page(five, 2, "desc", "i3")) == ["i2", "i1"]
    last = page(five, 2, "desc", "i1")
    assert ids(last) == ["i0"] and last.has_more is False
    assert ids(page(five, 20, "asc", None)) == ["i0", "i1", "i2", "i3", "i4"]
    assert ids(page(five, 3, "asc", "i1")) == ["i2", "i3", "i4"]
    assert page(five, 3, "asc", "i1").has_more is False
    empty = page(five, 3, "asc", "i4")
    assert (empty.data, empty.first_id, empty.last_id, empty.has_more) == ([], None, None, False)


@pytest.mark.parametrize(
    ("limit", "after", "param"), [(0, None, "limit"), (101, None, "limit"), (5, "nope", "after")]
)
def test_bad_limit_or_after_is_a_400_naming_it(limit: int, after: str | None, param: str) -> None:
    with pytest.raises(OpenAIError) as error:
        page(items(3), limit, "asc", after)
    assert (error.value.status_code, error.value.param) == (400, param)
