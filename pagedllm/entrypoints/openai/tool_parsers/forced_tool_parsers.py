"""The parsers of answers that structured outputs force into calls (vLLM's
`tool_choice="required"` and named tool choice; see tool_choice.py for their schemas).

A named choice's answer is the arguments' JSON itself: it streams out as argument pieces
of call 0. A required choice's answer is a JSON array of `{"name", "parameters"}`: each
element becomes a call as soon as it is complete. Text that is no such array (an answer
cut short, or produced without the constraint) is content if no call came out of it."""

import json

from pagedllm.entrypoints.openai.tool_parsers.abstract_tool_parser import (
    ToolCallDelta,
    ToolParser,
    ToolParserDelta,
    as_function_call,
)


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
        self.pos = 0  # where the next element (or the array's start) begins
        self.decoder = json.JSONDecoder()

    def feed(self, text: str) -> ToolParserDelta:
        self.text += text
        delta = ToolParserDelta()
        while (element := self._next_element()) is not None:
            call = as_function_call(element[0], ("parameters",))
            if call is None:
                break
            self.pos = element[1]
            delta.tool_calls.append(self.new_call(call))
        return delta

    def finish(self) -> ToolParserDelta:
        return ToolParserDelta(content="" if self.num_calls else self.text)

    def _next_element(self) -> tuple[object, int] | None:
        """(the array's next complete element, where it ends), or None for now."""
        pos = self._skip(self.pos, "[" if self.pos == 0 else ",")
        if pos is None:
            return None
        try:
            return self.decoder.raw_decode(self.text, pos)
        except json.JSONDecodeError:
            return None

    def _skip(self, pos: int, separator: str) -> int | None:
        """The position after whitespace, `separator` and whitespace, or None if the text
        does not go that far (or the array has ended)."""
        rest = self.text[pos:].lstrip()
        if not rest.startswith(separator):
            return None
        rest = rest[1:].lstrip()
        return len(self.text) - len(rest) if rest else None
