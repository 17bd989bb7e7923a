"""POST /v1/responses and the stored responses' routes with the default model and the
official `openai` client (reference: the client's own Response model and stream helper,
which parse and check what the server sends): text, streams whose deltas add up to the
non-streamed text, forced function calls and their results, text.format json_schema,
previous_response_id, GET, DELETE, input_items, and background responses run, fetched and
cancelled."""

import json
import time
from collections.abc import Iterator

import httpx
import jsonschema
import openai
import pytest
from fastapi.testclient import TestClient

from pagedllm import LLM
from pagedllm.engine.async_llm import AsyncLLM
from pagedllm.entrypoints.openai import api_server
from pagedllm.entrypoints.openai.serving_chat import OpenAIServingChat
from tests.entrypoints.openai.remote_server import MODEL_NAME, Server
from tests.entrypoints.openai.scripted_model import (
    ANSWER_CALL,
    ANSWER_REASONING,
    save_scripted_model,
)

ASK = dict(model=MODEL_NAME, temperature=0, max_output_tokens=60)
SHORT = "Answer in one short sentence: what is the capital of France?"
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [{"type": "function", "name": "get_weather", "parameters": WEATHER, "strict": True}]
FORCED = {"type": "function", "name": "get_weather"}


def test_text_response(client: openai.OpenAI) -> None:
    response = client.responses.create(input=SHORT, instructions="Be brief.", **ASK)
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.status == "completed" and response.incomplete_details is None
    assert response.model == MODEL_NAME and response.instructions == "Be brief."
    assert response.output_text.strip()
    (message,) = response.output
    assert message.type == "message" and message.role == "assistant"
    assert message.id.startswith("msg_") and message.status == "completed"
    assert message.content[0].type == "output_text" and message.content[0].annotations == []
    usage = response.usage
    assert usage.input_tokens > 0 and 0 < usage.output_tokens <= 60
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_tokens_details.cached_tokens >= 0
    assert usage.output_tokens_details.reasoning_tokens == 0
    assert response.tool_choice == "auto" and response.store is True


def test_max_output_tokens_make_an_incomplete_response(client: openai.OpenAI) -> None:
    response = client.responses.create(**{**ASK, "max_output_tokens": 3}, input="Tell a story.")
    assert response.status == "incomplete" and response.usage.output_tokens == 3
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.output[0].status == "incomplete"
    events = list(
        client.responses.create(
            **{**ASK, "max_output_tokens": 3}, input="Tell a story.", stream=True
        )
    )
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.output_text == response.output_text


def test_stream_events_add_up_to_the_whole_response(client: openai.OpenAI) -> None:
    whole = client.responses.create(input=SHORT, **ASK)
    with client.responses.stream(input=SHORT, **ASK) as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = [e.type for e in events]
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert types[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert set(types[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == whole.output_text == final.output_text
    assert events[0].response.status == "in_progress" and final.status == "completed"
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_stream_is_sse_with_event_lines(server: Server) -> None:
    body = {**ASK, "input": SHORT, "max_output_tokens": 2, "stream": True}
    text = httpx.post(server.url + "/v1/responses", json=body, timeout=60).text
    blocks = [b for b in text.split("\n\n") if b]
    for block in blocks:
        event_line, data_line = block.split("\n")
        assert (
            event_line.removeprefix("event: ")
            == json.loads(data_line.removeprefix("data: "))["type"]
        )
    assert blocks[-1].startswith("event: response.incomplete")


def test_forced_call_and_its_output_round_trip(client: openai.OpenAI) -> None:
    first = client.responses.create(
        input="What is the weather in Paris?", tools=TOOLS, tool_choice=FORCED, **ASK
    )
    (call,) = first.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert call.call_id and call.id.startswith("fc_") and call.status == "completed"
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    assert first.output_text == "" and first.tool_choice.name == "get_weather"
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "18 C, sunny"}
    stateless = client.responses.create(
        input=[{"role": "user", "content": "What is the weather in Paris?"}, call, result],
        tools=TOOLS,
        tool_choice="none",
        store=False,
        **{**ASK, "max_output_tokens": 8},
    )
    assert stateless.output_text and stateless.output[0].type == "message"
    stateful = client.responses.create(
        previous_response_id=first.id,
        input=[result],
        tools=TOOLS,
        tool_choice="none",
        **{**ASK, "max_output_tokens": 8},
    )
    assert stateful.output_text == stateless.output_text
    assert stateful.usage.input_tokens == stateless.usage.input_tokens
    assert stateful.usage.input_tokens > first.usage.input_tokens


def test_streamed_call_matches_the_whole_one(client: openai.OpenAI) -> None:
    kwargs = dict(input="Weather in Rome?", tools=TOOLS, tool_choice=FORCED, **ASK)
    whole = client.responses.create(**kwargs)
    with client.responses.stream(**kwargs) as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = [e.type for e in events]
    assert "response.function_call_arguments.delta" in types
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert done.arguments == whole.output[0].arguments == final.output[0].arguments


def test_text_format_json_schema(client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    text = {"format": {"type": "json_schema", "name": "person", "schema": schema, "strict": True}}
    response = client.responses.create(input="Invent a person.", text=text, **ASK)
    jsonschema.validate(json.loads(response.output_text), schema)
    assert response.text.format.type == "json_schema" and response.text.format.name == "person"
    as_object = client.responses.create(
        input="A JSON object, please.", text={"format": {"type": "json_object"}}, **ASK
    )
    assert isinstance(json.loads(as_object.output_text), dict)


def test_previous_response_id_continues_the_conversation(client: openai.OpenAI) -> None:
    first = client.responses.create(input="My name is Ada.", instructions="Be brief.", **ASK)
    second = client.responses.create(input="What is my name?", previous_response_id=first.id, **ASK)
    assert second.previous_response_id == first.id and second.instructions is None
    # The second prompt holds the first exchange (less the first's instructions).
    assert second.usage.input_tokens > first.usage.output_tokens + 5
    assert second.usage.input_tokens_details.cached_tokens >= 0


def test_get_delete_and_cancel(client: openai.OpenAI, server: Server) -> None:
    response = client.responses.create(
        input="Hi", metadata={"k": "v"}, **{**ASK, "max_output_tokens": 2}
    )
    again = client.responses.retrieve(response.id)
    assert again.model_dump() == response.model_dump() and again.metadata == {"k": "v"}
    cancel = httpx.post(f"{server.url}/v1/responses/{response.id}/cancel")
    assert cancel.status_code == 400 and "background" in cancel.json()["error"]["message"]
    deleted = httpx.delete(f"{server.url}/v1/responses/{response.id}").json()
    assert deleted == {"id": response.id, "object": "response", "deleted": True}
    with pytest.raises(openai.NotFoundError, match="not found"):
        client.responses.retrieve(response.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(response.id)
    unstored = client.responses.create(input="Hi", store=False, **{**ASK, "max_output_tokens": 2})
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def running(server: Server) -> float:
    text = httpx.get(server.url + "/metrics").text
    (line,) = [line for line in text.splitlines() if line.startswith("vllm:num_requests_running{")]
    return float(line.rsplit(" ", 1)[1])


def test_background_response_is_cancelled_and_its_request_aborted(
    client: openai.OpenAI, server: Server
) -> None:
    """A long background answer cancelled at once: `cancelled` (GET says so too, with no
    output), the engine's request aborted long before 1500 tokens; a second cancel, and
    a cancel of a foreground response, are 400s."""
    long = dict(model=MODEL_NAME, temperature=0, max_output_tokens=1500)
    queued = client.responses.create(**long, input="Tell a very long story.", background=True)
    assert queued.status == "queued" and queued.background is True and queued.output == []
    with pytest.raises(openai.BadRequestError, match="still") as error:
        client.responses.create(**long, input="Go on.", previous_response_id=queued.id)
    assert error.value.body["param"] == "previous_response_id"
    cancelled = client.responses.cancel(queued.id)
    assert cancelled.id == queued.id and cancelled.status == "cancelled"
    deadline = time.monotonic() + 10
    while running(server) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert running(server) == 0
    again = client.responses.retrieve(queued.id)
    assert again.status == "cancelled" and again.output == []
    with pytest.raises(openai.BadRequestError, match="cancelled"):
        client.responses.cancel(queued.id)


def test_bad_requests_are_openai_errors(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.responses.create(**{**ASK, "model": "gpt-9"}, input="Hi")
    with pytest.raises(openai.NotFoundError) as error:
        client.responses.create(**ASK, input="Hi", previous_response_id="resp_unknown")
    assert error.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.BadRequestError, match="not one of the tools"):
        client.responses.create(
            **ASK, input="Hi", tools=TOOLS, tool_choice={"type": "function", "name": "nope"}
        )
    with pytest.raises(openai.BadRequestError, match="background=true") as error:
        client.responses.create(**ASK, input="Hi", background=True, store=False)
    assert error.value.body["param"] == "background"
    with pytest.raises(openai.BadRequestError, match="input is empty"):
        client.responses.create(**ASK, input=[])
    output = {"type": "function_call_output", "call_id": "call_zzz", "output": "18 C"}
    with pytest.raises(openai.BadRequestError, match="'call_zzz' does not follow") as error:
        client.responses.create(**ASK, input=[{"role": "user", "content": "Hi"}, output])
    assert error.value.body["param"] == "input"
    for limit in (0, 10**12):  # named as the request names it
        with pytest.raises(openai.BadRequestError, match="max_output_tokens") as error:
            client.responses.create(**{**ASK, "max_output_tokens": limit}, input="Hi")
        assert error.value.body["param"] == "max_output_tokens"
        assert "max_tokens" not in error.value.body["message"]


@pytest.mark.parametrize("background", [False, True])
def test_a_forced_call_with_a_schema_llguidance_refuses_is_a_400_naming_tools(
    client: openai.OpenAI, background: bool
) -> None:
    """Checked before the response is queued, so a background one is refused too."""
    bad = {"type": "object", "properties": {"a": {"$ref": "#/$defs/Nope"}}}
    tool = {"type": "function", "name": "f", "parameters": bad}
    with pytest.raises(openai.BadRequestError, match="tools has an unsupported") as error:
        client.responses.create(
            **ASK, input="Hi", tools=[tool], tool_choice="required", background=background
        )
    assert error.value.body["param"] == "tools"


@pytest.mark.parametrize("background", [False, True])
def test_a_priority_the_server_does_not_schedule_by_is_a_400_naming_it(
    client: openai.OpenAI, background: bool
) -> None:
    """vLLM's rule (input_processor.check_priority), checked before the response is
    queued, so a background one is refused too."""
    with pytest.raises(openai.BadRequestError, match="Got priority 1 but priority") as error:
        client.responses.create(
            **ASK, input="Hi", background=background, extra_body={"priority": 1}
        )
    assert error.value.body["param"] == "priority"


# Reasoning and parsed calls: the scripted model (scripted_model.py: it thinks "hmm", then
# calls get_weather) behind an in-process app with the qwen3 and hermes parsers.


@pytest.fixture(scope="module")
def scripted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    folder = tmp_path_factory.mktemp("scripted")
    save_scripted_model(str(folder))
    llm = LLM(model=str(folder), num_kv_blocks=64, max_model_len=256)
    options = dict(reasoning_parser="qwen3", tool_call_parser="hermes")
    app = api_server.build_app(AsyncLLM(llm.llm_engine), ["scripted"], **options)
    with TestClient(app) as http:
        yield openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=http)


def test_reasoning_and_auto_calls_streamed_and_whole(scripted: openai.OpenAI) -> None:
    tools = [{"type": "function", "name": "get_weather", "parameters": {}}]
    kwargs = dict(model="scripted", input="Weather?", tools=tools, temperature=0)
    whole = scripted.responses.create(**kwargs, max_output_tokens=30)
    reasoning, call = whole.output
    assert reasoning.type == "reasoning" and reasoning.id.startswith("rs_")
    assert reasoning.content[0].type == "reasoning_text"
    assert reasoning.content[0].text.strip() == ANSWER_REASONING and reasoning.summary == []
    assert (call.type, call.name, call.arguments) == ("function_call", *ANSWER_CALL.values())
    assert whole.usage.output_tokens_details.reasoning_tokens > 0
    with scripted.responses.stream(**kwargs, max_output_tokens=30) as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = [e.type for e in events]
    assert types.index("response.reasoning_text.done") < types.index(
        "response.function_call_arguments.done"
    )
    deltas = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert deltas == reasoning.content[0].text
    own = {"id", "call_id", "parsed_arguments"}  # ids, and what the stream helper adds
    assert [i.model_dump(exclude=own) for i in final.output] == [
        i.model_dump(exclude=own) for i in whole.output
    ]
    answer = scripted.responses.create(
        model="scripted",
        previous_response_id=whole.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
        tools=tools,
        temperature=0,
        max_output_tokens=30,
    )
    assert answer.output_text.strip() == "It is sunny"


def wait_for(client: openai.OpenAI, response_id: str) -> object:
    """The response once it left `queued` / `in_progress` (within 30 s)."""
    deadline = time.monotonic() + 30
    while (response := client.responses.retrieve(response_id)).status in ("queued", "in_progress"):
        assert time.monotonic() < deadline, "the background response never finished"
        time.sleep(0.02)
    return response


def test_background_response_runs_and_equals_the_foreground_one(scripted: openai.OpenAI) -> None:
    tools = [{"type": "function", "name": "get_weather", "parameters": {}}]
    kwargs = dict(model="scripted", input="Weather?", tools=tools, temperature=0)
    whole = scripted.responses.create(**kwargs, max_output_tokens=30)
    queued = scripted.responses.create(**kwargs, max_output_tokens=30, background=True)
    assert queued.status == "queued" and queued.output == [] and queued.usage is None
    done = wait_for(scripted, queued.id)
    assert done.status == "completed" and done.background is True
    own = {"id", "call_id"}
    assert [i.model_dump(exclude=own) for i in done.output] == [
        i.model_dump(exclude=own) for i in whole.output
    ]
    assert done.usage == whole.usage
    with pytest.raises(openai.BadRequestError, match="completed"):
        scripted.responses.cancel(queued.id)
    cut = scripted.responses.create(**kwargs, max_output_tokens=2, background=True)
    assert wait_for(scripted, cut.id).status == "incomplete"
    follow = scripted.responses.create(
        model="scripted",
        previous_response_id=done.id,
        input=[{"type": "function_call_output", "call_id": done.output[1].call_id, "output": "x"}],
        temperature=0,
        max_output_tokens=30,
    )
    assert follow.output_text.strip() == "It is sunny"


def test_input_items_list_the_requests_own_input(scripted: openai.OpenAI) -> None:
    """OpenAI's list: the last item first by default, `order`, `limit` and the client's
    auto-paging over `after`; ids sent are kept; an earlier response's items are not
    listed again after previous_response_id."""
    conversation = [
        {"role": "user", "content": "Weather?"},
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city": "Paris"}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
    ]
    response = scripted.responses.create(
        model="scripted", input=conversation, temperature=0, max_output_tokens=30
    )
    listed = scripted.responses.input_items.list(response.id)
    assert [i.type for i in listed.data] == ["function_call_output", "function_call", "message"]
    assert listed.has_more is False
    output, call, message = listed.data
    assert (call.id, call.name, call.arguments) == ("fc_1", "get_weather", '{"city": "Paris"}')
    assert (output.call_id, output.output) == ("call_1", "sunny")
    assert (message.role, message.content[0].type, message.content[0].text) == (
        "user",
        "input_text",
        "Weather?",
    )
    first = scripted.responses.input_items.list(response.id, order="asc", limit=1)
    assert [i.id for i in first.data] == [message.id] and first.has_more is True
    paged = [i.id for i in scripted.responses.input_items.list(response.id, order="asc", limit=1)]
    assert paged == [message.id, "fc_1", output.id]
    follow = scripted.responses.create(
        model="scripted", previous_response_id=response.id, input="Weather?", max_output_tokens=5
    )
    (only,) = scripted.responses.input_items.list(follow.id).data
    assert only.content[0].text == "Weather?"
    with pytest.raises(openai.NotFoundError):
        scripted.responses.input_items.list("resp_unknown")
    with pytest.raises(openai.BadRequestError) as info:
        scripted.responses.input_items.list(response.id, extra_query={"order": "up"})
    assert info.value.body["param"] == "order"  # as the client named it, not "query"


def test_a_background_failure_ends_the_response_failed(
    scripted: openai.OpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def fail(*args: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(OpenAIServingChat, "answer", fail)
    queued = scripted.responses.create(model="scripted", input="Weather?", background=True)
    failed = wait_for(scripted, queued.id)
    assert failed.status == "failed" and failed.output == []
    assert failed.error.code == "server_error" and "boom" in failed.error.message
    streamed = scripted.responses.create(
        model="scripted", input="Weather?", background=True, stream=True
    )
    (event,) = list(streamed)  # the run failed before its first event
    assert event.type == "response.failed" and event.sequence_number == 0
    assert event.response.status == "failed" and "boom" in event.response.error.message
    assert scripted.responses.retrieve(event.response.id).status == "failed"
