"""ResponseEvents: numbering, replay after `starting_after`, following live events, and
readers that leave or come after the end."""

import asyncio

from pagedllm.entrypoints.openai.response_events import ResponseEvents


async def _read(events: ResponseEvents, starting_after: int | None = None) -> list[int]:
    return [e["sequence_number"] async for e in events.follow(starting_after)]


def test_events_are_numbered_and_replayed_after_starting_after() -> None:
    events = ResponseEvents()
    for i in range(4):
        events.append({"type": "t", "i": i})
    events.close()
    events.append({"type": "late"})  # ignored once closed
    assert [e["i"] for e in events.events] == [0, 1, 2, 3]
    assert asyncio.run(_read(events)) == [0, 1, 2, 3]
    assert asyncio.run(_read(events, 1)) == [2, 3]
    assert asyncio.run(_read(events, 3)) == []
    assert asyncio.run(_read(events, -1)) == [0, 1, 2, 3]


def test_readers_follow_live_events_and_one_leaving_stops_nothing() -> None:
    async def main() -> tuple[list[int], list[int], list[int]]:
        events = ResponseEvents()
        events.append({"type": "t"})
        whole = asyncio.create_task(_read(events))
        resumed = asyncio.create_task(_read(events, 0))
        leaving = events.follow()
        first = await anext(leaving)
        await leaving.aclose()  # a client going away
        for _ in range(3):
            await asyncio.sleep(0)
            events.append({"type": "t"})
        events.close()
        return await whole, await resumed, [first["sequence_number"]]

    whole, resumed, left = asyncio.run(main())
    assert whole == [0, 1, 2, 3] and resumed == [1, 2, 3] and left == [0]
