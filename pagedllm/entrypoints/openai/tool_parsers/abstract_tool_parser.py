"""ToolParser: the tool calls in a chat answer, from the whole text or piece by piece.

One parser reads one answer. `feed` takes the answer's next piece and returns the content
and tool-call deltas it settles; `finish` returns what was held back. The whole-text
`extract_tool_calls` is `feed` + `finish`, so a streamed answer accumulates to exactly the
non-streamed one. A call may be announced in several deltas of the same `index` (its name
in the first, its arguments' JSON text in pieces) or whole in one.
"""

import json
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass
class FunctionCall:
    name: str
    arguments: str  # JSON text


@dataclass
class ToolCallDelta:
    index: int  # which call of the answer, from 0
    name: str | None = None  # set in the call's first delta only
    arguments: str = ""  # the next piece of the arguments' JSON text


@dataclass
class ToolParserDelta:
    content: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)


@dataclass
class ExtractedToolCallInformation:
    tools_called: bool
    tool_calls: list[FunctionCall]
    content: str | None


class ToolParser(ABC):
    def __init__(self) -> None:
        self.num_calls = 0

    def calls_tool(self, name: str) -> bool:
        """Whether a call of `name` read from the answer is a call (the generic format's
        parser refuses names that are not the request's tools)."""
        return True

    @abstractmethod
    def feed(self, text: str) -> ToolParserDelta:
        """The content and calls that `text`, the answer's next piece, settles."""

    @abstractmethod
    def finish(self) -> ToolParserDelta:
        """What is held back once the answer has ended."""

    def extract_tool_calls(self, model_output: str) -> ExtractedToolCallInformation:
        first, last = self.feed(model_output), self.finish()
        calls = join_tool_call_deltas(first.tool_calls + last.tool_calls)
        content = first.content + last.content
        return ExtractedToolCallInformation(bool(calls), calls, content or None)

    def new_call(self, call: FunctionCall) -> ToolCallDelta:
        """The one delta announcing a whole call, numbered after the ones before."""
        self.num_calls += 1
        return ToolCallDelta(self.num_calls - 1, call.name, call.arguments)


def join_tool_call_deltas(deltas: Iterable[ToolCallDelta]) -> list[FunctionCall]:
    """The calls that `deltas` announce, in index order."""
    calls: dict[int, FunctionCall] = {}
    for delta in deltas:
        call = calls.setdefault(delta.index, FunctionCall(delta.name or "", ""))
        call.arguments += delta.arguments
    return [calls[i] for i in sorted(calls)]


def as_function_call(value: object, argument_keys: tuple[str, ...]) -> FunctionCall | None:
    """`{"name": str, <one of argument_keys>: object or JSON text}` as a call, else None.
    The arguments become JSON text (non-ASCII kept, as vLLM writes them)."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    key = next((k for k in argument_keys if k in value), None)
    arguments = {} if key is None else value[key]
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return FunctionCall(value["name"], arguments)
