"""ChoiceParser: one chat choice's generated text -> reasoning, content and tool calls.

The server's reasoning parser (if any) splits off the reasoning first; the request's tool
parser (if any) reads the calls out of the content after it. Streamed pieces and a whole
text take the same path (`parse` is `feed` + `finish`), so a stream accumulates to the
non-streamed answer. With `parallel_tool_calls` false only the first call is kept, as vLLM
does.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

from pagedllm.entrypoints.openai.reasoning import ReasoningDelta, ReasoningParser
from pagedllm.entrypoints.openai.tool_parsers import ToolCallDelta, ToolParser


@dataclass
class ChoiceDelta:
    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)

    def __add__(self, other: "ChoiceDelta") -> "ChoiceDelta":
        return ChoiceDelta(
            self.reasoning + other.reasoning,
            self.content + other.content,
            self.tool_calls + other.tool_calls,
        )


class ChoiceParser:
    def __init__(
        self,
        reasoning: ReasoningParser | None,
        tools: ToolParser | None,
        parallel_tool_calls: bool = True,
    ) -> None:
        self.reasoning = reasoning
        self.tools = tools
        self.parallel_tool_calls = parallel_tool_calls
        self.tools_called = False

    def feed(self, text: str) -> ChoiceDelta:
        """What `text`, the choice's next piece, settles."""
        split = self.reasoning.feed(text) if self.reasoning else ReasoningDelta(content=text)
        return self._read_tools(split, finished=False)

    def finish(self) -> ChoiceDelta:
        """What is held back once the choice has ended."""
        split = self.reasoning.finish() if self.reasoning else ReasoningDelta()
        return self._read_tools(split, finished=True)

    def parse(self, text: str) -> ChoiceDelta:
        return self.feed(text) + self.finish()

    def _read_tools(self, split: ReasoningDelta, finished: bool) -> ChoiceDelta:
        if self.tools is None:
            return ChoiceDelta(split.reasoning, split.content)
        found = [self.tools.feed(split.content)] + ([self.tools.finish()] if finished else [])
        content = "".join(delta.content for delta in found)
        calls = [c for delta in found for c in delta.tool_calls]
        calls = [c for c in calls if self.parallel_tool_calls or c.index == 0]
        self.tools_called = self.tools_called or bool(calls)
        return ChoiceDelta(split.reasoning, content, calls)


def choice_parser_factory(
    reasoning_parser: type[ReasoningParser] | None,
    tool_parser: Callable[[], ToolParser] | None,
    prompt: str,
    parallel_tool_calls: bool,
    prefill: str | None = None,
) -> Callable[[], ChoiceParser] | None:
    """A new parser per choice of a request, or None when its answers are plain content;
    `prompt` and `prefill` as ReasoningParser takes them."""
    if reasoning_parser is None and tool_parser is None:
        return None

    def make() -> ChoiceParser:
        reasoning = reasoning_parser(prompt, prefill) if reasoning_parser else None
        return ChoiceParser(reasoning, tool_parser() if tool_parser else None, parallel_tool_calls)

    return make
