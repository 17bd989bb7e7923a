"""The generic format's answers (generic_tools.py prompts and constrains them): plain text,
or one JSON object `{"tool_calls": [{"name": "f", "arguments": {...}}, ...]}`.

An answer whose first non-space character is `{` is calls: each call's name goes out once
its `"arguments"` key has been read, then its arguments' JSON text in pieces as they come
(call_stream.py). Any other answer is content, streamed as it comes. Calls text that never
names a call (an answer produced without the constraint) is content at the end; after a
call, text that does not follow the shape is dropped."""

import re

from pagedllm.entrypoints.openai.tool_parsers.abstract_tool_parser import (
    ToolParser,
    ToolParserDelta,
)
from pagedllm.entrypoints.openai.tool_parsers.call_stream import CallStream, call_object

_FIRST_CALL = re.compile(r'\s*\{\s*"tool_calls"\s*:\s*\[\s*' + call_object())
_NEXT_CALL = re.compile(r"\s*\}\s*,\s*" + call_object())
_UNDECIDED, _CALLS, _CONTENT = "undecided", "calls", "content"


class GenericToolParser(ToolParser):
    def __init__(self) -> None:
        super().__init__()
        self.text = ""
        self.state = _UNDECIDED
        self.calls = CallStream(self, _FIRST_CALL, _NEXT_CALL)

    def feed(self, text: str) -> ToolParserDelta:
        self.text += text
        if self.state == _UNDECIDED:
            start = self.text.lstrip()
            if start:
                self.state = _CALLS if start.startswith("{") else _CONTENT
        if self.state == _CONTENT:
            content, self.text = self.text, ""
            return ToolParserDelta(content=content)
        if self.state == _CALLS:
            return ToolParserDelta(tool_calls=self.calls.read(self.text))
        return ToolParserDelta()

    def finish(self) -> ToolParserDelta:
        if self.state == _CONTENT or self.num_calls:
            return ToolParserDelta()
        return ToolParserDelta(content=self.text)
