"""The parsers of answers that structured outputs force into calls (vLLM's
`tool_choice="required"` and named tool choice; see tool_choice.py for their schemas).

A named choice's answer is the arguments' JSON itself: it streams out as argument pieces
of call 0. A required choice's answer is a JSON array of `{"name", "parameters"}` (the
schema's order): each call's name goes out once its parameters begin, then their JSON text
in pieces as they are generated (call_stream.py). Text that is no such array (produced
without the constraint) is content if no call came out of it, unless it ended before its
first call began (max_tokens or a stop string: nothing)."""

import re

from pagedllm.entrypoints.openai.tool_parsers.abstract_tool_parser import (
    ToolCallDelta,
    ToolParser,
    ToolParserDelta,
)
from pagedllm.entrypoints.openai.tool_parsers.call_stream import (
    CallStream,
    call_object,
    cut_short,
)

_FIRST_CALL = re.compile(r"\s*\[\s*" + call_object("parameters"))
_NEXT_CALL = re.compile(r"\s*\}\s*,\s*" + call_object("parameters"))


class NamedToolParser(ToolParser):
    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def feed(self, text: str) -> ToolParserDelta:
        if not text:
            return ToolParserDelta()
        return ToolParserDelta(tool_calls=[self._piece(text)])

    def finish(self) -> ToolParserDelta:
        return ToolParserDelta(tool_calls=[] if self.num_calls else [self._piece("")])

    def _piece(self, arguments: str) -> ToolCallDelta:
        first = self.num_calls == 0
        self.num_calls = 1
        return ToolCallDelta(0, self.name if first else None, arguments)


class RequiredToolParser(ToolParser):
    def __init__(self) -> None:
        super().__init__()
        self.text = ""
        self.calls = CallStream(self, _FIRST_CALL, _NEXT_CALL)

    def feed(self, text: str) -> ToolParserDelta:
        self.text += text
        return ToolParserDelta(tool_calls=self.calls.read(self.text))

    def finish(self) -> ToolParserDelta:
        if self.num_calls or cut_short(_FIRST_CALL, self.text):  # cut off before a call began
            return ToolParserDelta()
        return ToolParserDelta(content=self.text)
