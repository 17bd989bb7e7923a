"""Requests whose structured-output grammar is still compiling (vLLM's WAITING_FOR_FSM).

They wait here, outside the scheduler, while the StructuredOutputManager compiles on its
own thread; each joins the scheduler's waiting queue once its matchers are ready, so a
compile (or the first one's tokenizer build) never holds up the other requests' steps.
"""

from concurrent.futures import FIRST_COMPLETED, Future, wait

from pagedllm.engine.request import Request
from pagedllm.structured_output import GrammarMatcher


class WaitingForGrammar:
    def __init__(self) -> None:
        self._pending: dict[str, tuple[Request, Future[list[GrammarMatcher]]]] = {}

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, request: Request, matchers: "Future[list[GrammarMatcher]]") -> None:
        self._pending[request.request_id] = (request, matchers)

    def discard(self, request_id: str) -> None:
        """Forget an aborted request (its compile, if not started, is cancelled)."""
        entry = self._pending.pop(request_id, None)
        if entry is not None:
            entry[1].cancel()

    def pop_ready(self, timeout: float = 0.0) -> list[Request]:
        """The requests whose compile has ended, in arrival order, with their matchers set,
        or their `error` when the grammar did not compile. With a timeout, wait up to that
        long for the first one (for an engine with nothing else to run)."""
        if timeout > 0 and self._pending:
            wait([f for _, f in self._pending.values()], timeout, FIRST_COMPLETED)
        ready = [rid for rid, (_, f) in self._pending.items() if f.done()]
        requests = []
        for rid in ready:
            request, matchers = self._pending.pop(rid)
            error = matchers.exception()
            if error is None:
                request.matchers = matchers.result()
            else:
                request.error = error
            requests.append(request)
        return requests
