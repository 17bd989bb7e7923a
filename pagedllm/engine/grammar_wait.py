"""Requests whose structured-output grammar is still compiling (vLLM's WAITING_FOR_FSM).

They wait here, outside the scheduler, while the StructuredOutputManager compiles on its
own thread; each joins the scheduler's waiting queue once its matchers are ready, so a
compile (or the first one's tokenizer build) never holds up the other requests' steps.
"""

from concurrent.futures import FIRST_COMPLETED, wait

from pagedllm.engine.request import Request


class WaitingForGrammar:
    """Requests by id, each with its compile in `Request.compiling_matchers`."""

    def __init__(self) -> None:
        self._pending: dict[str, Request] = {}

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, request: Request) -> None:
        assert request.compiling_matchers is not None, "only a request with a compile waits"
        self._pending[request.request_id] = request

    def discard(self, request_id: str) -> None:
        """Forget an aborted request (its compile, if not started, is cancelled)."""
        request = self._pending.pop(request_id, None)
        if request is not None:
            request.compiling_matchers.cancel()

    def pop_ready(self, timeout: float = 0.0) -> list[Request]:
        """The requests whose compile has ended, in arrival order, with their matchers set,
        or their `error` when the grammar did not compile. With a timeout, wait up to that
        long for the first one (for an engine with nothing else to run)."""
        if timeout > 0 and self._pending:
            wait([r.compiling_matchers for r in self._pending.values()], timeout, FIRST_COMPLETED)
        ready = [r for r in self._pending.values() if r.compiling_matchers.done()]
        for request in ready:
            del self._pending[request.request_id]
            compile_, request.compiling_matchers = request.compiling_matchers, None
            error = compile_.exception()
            if error is None:
                request.matchers = compile_.result()
            else:
                request.error = error
        return ready
