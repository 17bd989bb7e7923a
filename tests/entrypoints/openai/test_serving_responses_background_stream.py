"""`background: true` with `stream: true` on POST /v1/responses, and its resumption with
GET /v1/responses/{id}?stream=true&starting_after=N, through the official `openai` client
on the default model (reference: the same request streamed without background, greedy):
the same events, numbered from 0; a resume gives exactly the events after N; a dropped
POST stream leaves the run going; cancel ends the streams and the response `cancelled`;
a response not created with background and stream is a 400, an unknown id a 404."""

import time

import openai
import pytest

from tests.entrypoints.openai.remote_server import MODEL_NAME

ASK = dict(model=MODEL_NAME, temperature=0, max_output_tokens=24)
SHORT = "Answer in one short sentence: what is the capital of France?"
LONG = dict(ASK, max_output_tokens=1500, input="Tell a very long story.")


def _shape(event: object) -> tuple:
    """What a background stream shares with a foreground one (ids and `background` differ)."""
    response = getattr(event, "response", None)
    status = response.status if response is not None else None
    return event.type, getattr(event, "delta", None), getattr(event, "text", None), status


def test_background_stream_equals_the_plain_stream_and_resumes(client: openai.OpenAI) -> None:
    plain = list(client.responses.create(input=SHORT, **ASK, stream=True))
    events = list(client.responses.create(input=SHORT, **ASK, background=True, stream=True))
    assert [_shape(e) for e in events] == [_shape(e) for e in plain]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response
    assert events[-1].type == "response.completed" and final.background is True
    assert final.output_text == plain[-1].response.output_text != ""
    stored = client.responses.retrieve(final.id)
    assert stored.status == "completed" and stored.output_text == final.output_text

    dumped = [e.model_dump() for e in events]
    whole = list(client.responses.retrieve(final.id, stream=True))
    assert [e.model_dump() for e in whole] == dumped
    for n in (0, 3, len(events) - 2, len(events) - 1):
        resumed = list(client.responses.retrieve(final.id, stream=True, starting_after=n))
        assert [e.model_dump() for e in resumed] == dumped[n + 1 :]


def _wait(client: openai.OpenAI, response_id: str) -> object:
    deadline = time.monotonic() + 60
    while (response := client.responses.retrieve(response_id)).status == "in_progress":
        assert time.monotonic() < deadline, "the background response never finished"
        time.sleep(0.05)
    return response


def test_a_dropped_post_stream_leaves_the_run_going(client: openai.OpenAI) -> None:
    """The client reads a few events and goes, and so does a resumed GET; GET shows the
    run still in progress, another resume follows it live to its end, and GET then finds
    it finished."""
    kwargs = {**LONG, "max_output_tokens": 100}
    stream = client.responses.create(**kwargs, background=True, stream=True)
    first = [next(iter(stream)) for _ in range(4)]
    stream.close()
    response_id = first[0].response.id
    assert client.responses.retrieve(response_id).status == "in_progress"
    dropped = client.responses.retrieve(response_id, stream=True, starting_after=3)
    assert next(iter(dropped)).sequence_number == 4
    dropped.close()
    assert client.responses.retrieve(response_id).status == "in_progress"
    resumed = list(client.responses.retrieve(response_id, stream=True, starting_after=3))
    assert [e.sequence_number for e in resumed] == list(range(4, 4 + len(resumed)))
    assert resumed[-1].type == "response.incomplete"
    done = _wait(client, response_id)
    assert done.status == "incomplete" and done.usage.output_tokens == 100
    assert done.output_text == resumed[-1].response.output_text


def test_cancel_mid_stream_ends_the_streams_cancelled(client: openai.OpenAI) -> None:
    stream = client.responses.create(**LONG, background=True, stream=True)
    events = []
    for event in stream:
        events.append(event)
        if event.type == "response.output_text.delta":
            break
    response_id = events[0].response.id
    assert client.responses.cancel(response_id).status == "cancelled"
    events += list(stream)  # the POST's stream ends after the cancel, with no event of its own
    assert events[-1].type.startswith("response.output_text") or events[-1].type.startswith(
        "response.content_part"
    ), events[-1].type
    assert not any(e.type in ("response.completed", "response.incomplete") for e in events)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    resumed = list(client.responses.retrieve(response_id, stream=True))
    assert [e.model_dump() for e in resumed] == [e.model_dump() for e in events]
    assert client.responses.retrieve(response_id).status == "cancelled"


def test_streaming_a_response_that_was_not_background_streamed(client: openai.OpenAI) -> None:
    plain = client.responses.create(input="Hi", **{**ASK, "max_output_tokens": 2})
    background = client.responses.create(
        input="Hi", **{**ASK, "max_output_tokens": 2}, background=True
    )
    for response_id in (plain.id, background.id):
        with pytest.raises(openai.BadRequestError, match="background=true and stream=true"):
            client.responses.retrieve(response_id, stream=True)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_unknown", stream=True, starting_after=2)
