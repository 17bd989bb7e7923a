"""ResponseEvents: the events a background streamed response (`background: true` with
`stream: true`) has produced, kept with its stored response so that the POST's stream and
any number of `GET /v1/responses/{id}?stream=true&starting_after=N` follow the same run.

The run appends each event, numbered from 0 in order (its `sequence_number`), and closes
the list when the response ends; a reader replays the events after `starting_after` and
then waits for the live ones. A reader going away (a client disconnecting) leaves the run
and the other readers alone.
"""

import asyncio
from collections.abc import AsyncIterator
from typing import Any

Event = dict[str, Any]


class ResponseEvents:
    def __init__(self) -> None:
        self.events: list[Event] = []
        self.closed = False
        self._changed = asyncio.Event()

    def append(self, event: Event) -> None:
        """Add `event` with the next `sequence_number` (nothing once closed)."""
        if self.closed:
            return
        self.events.append(event | {"sequence_number": len(self.events)})
        self._wake()

    def close(self) -> None:
        """The response has ended: readers stop after the last event."""
        self.closed = True
        self._wake()

    async def follow(self, starting_after: int | None = None) -> AsyncIterator[Event]:
        """The events whose `sequence_number` is greater than `starting_after` (all of them
        without it), then each new one until the list is closed."""
        index = 0 if starting_after is None else max(starting_after + 1, 0)
        while True:
            while index < len(self.events):
                yield self.events[index]
                index += 1
            if self.closed:
                return
            changed = self._changed
            await changed.wait()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()
