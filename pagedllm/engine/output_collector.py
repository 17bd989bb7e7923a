"""RequestOutputCollector: one request's outputs handed from the engine thread to the
asyncio task that consumes them (vLLM's, in its AsyncLLM).

It holds at most one output. When the engine makes a new one before the consumer took the
last, DELTA outputs are merged into one (`RequestOutput.add`) and a CUMULATIVE output
replaces the older one (it holds all of it). So a consumer that falls behind, such as a
server streaming hundreds of requests, sends one larger chunk per request rather than one
per step, and its work a step stays bounded by the number of requests rather than growing
with how far behind it is. An exception (the request failed) replaces what is held, is
kept over any output put after it, and is raised by `get`.
"""

import asyncio

from pagedllm.outputs import PoolingRequestOutput, RequestOutput

Output = RequestOutput | PoolingRequestOutput


class RequestOutputCollector:
    """Lives on the event loop: `put` and `get` are called there only."""

    def __init__(self, aggregate: bool) -> None:
        """`aggregate`: the request's outputs are DELTA ones, merged rather than replaced."""
        self.aggregate = aggregate
        self.output: Output | BaseException | None = None
        self.ready = asyncio.Event()

    def put(self, output: Output | BaseException) -> None:
        held = self.output
        if isinstance(held, BaseException) and not isinstance(output, BaseException):
            return  # the request failed: what it made after that is not shown
        if self.aggregate and isinstance(held, RequestOutput) and isinstance(output, RequestOutput):
            held.add(output)
        else:
            self.output = output
        self.ready.set()

    async def get(self) -> Output:
        """The next output, waiting for one; raises the request's error."""
        while self.output is None:
            await self.ready.wait()
            self.ready.clear()
        output, self.output = self.output, None
        if isinstance(output, BaseException):
            raise output
        return output
