"""The generic format's answers (generic_tools.py prompts and constrains them): plain text,
or one JSON object `{"tool_calls": [{"name": "f", "arguments": {...}}, ...]}`.

An answer whose first non-space character is `{` is calls: each call's name goes out once
its `"arguments"` key has been read, then its arguments' JSON text in pieces as they come.
Any other answer is content, streamed as it comes. Calls text that never names a call (an
answer produced without the constraint) is content at the end; after a call, text that
does not follow the shape is dropped."""

import json
import re

from pagedllm.entrypoints.openai.tool_parsers.abstract_tool_parser import (
    ToolCallDelta,
    ToolParser,
    ToolParserDelta,
)

_NAME = r'\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*'
_FIRST_CALL = re.compile(r'\s*\{\s*"tool_calls"\s*:\s*\[\s*' + _NAME)
_NEXT_CALL = re.compile(r"\s*\}\s*,\s*" + _NAME)
_UNDECIDED, _CALLS, _CONTENT = "undecided", "calls", "content"


class GenericToolParser(ToolParser):
    def __init__(self) -> None:
        super().__init__()
        self.text = ""
        self.pos = 0  # how far the calls text has been read
        self.state = _UNDECIDED
        self.arguments: _ValueScanner | None = None  # the open call's arguments

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
            return ToolParserDelta(tool_calls=self._read_calls())
        return ToolParserDelta()

    def finish(self) -> ToolParserDelta:
        if self.state == _CONTENT or self.num_calls:
            return ToolParserDelta()
        return ToolParserDelta(content=self.text)

    def _read_calls(self) -> list[ToolCallDelta]:
        deltas = []
        while True:
            if self.arguments is not None:
                if not self.arguments.started:  # skip the spaces before the value
                    self.pos = len(self.text) - len(self.text[self.pos :].lstrip())
                end = self.arguments.scan(self.text, self.pos)
                piece, self.pos = self.text[self.pos : end], end
                if deltas:  # the open call's name, read in this same feed
                    deltas[-1].arguments += piece
                elif piece:
                    deltas.append(ToolCallDelta(self.num_calls - 1, arguments=piece))
                if not self.arguments.done:
                    return deltas
                self.arguments = None
            pattern = _NEXT_CALL if self.num_calls else _FIRST_CALL
            match = pattern.match(self.text, self.pos)
            if match is None:
                return deltas
            self.pos = match.end()
            self.num_calls += 1
            self.arguments = _ValueScanner()
            deltas.append(ToolCallDelta(self.num_calls - 1, json.loads(match[1])))


class _ValueScanner:
    """Where one JSON value, read a piece at a time, ends: brackets and strings are
    tracked, a bare number or literal ends at the first delimiter after it."""

    def __init__(self) -> None:
        self.depth = 0
        self.started = False
        self.in_string = False
        self.escaped = False
        self.done = False

    def scan(self, text: str, pos: int) -> int:
        """Where the value's part of `text[pos:]` ends (its end, or the text's)."""
        for end in range(pos, len(text)):
            if self._ends_before(text[end]):
                self.done = True
                return end
            if self.done:
                return end + 1
        return len(text)

    def _ends_before(self, char: str) -> bool:
        """Reads `char`; True if the value ended before it (a bare scalar's delimiter)."""
        if self.in_string:
            self.in_string = self.escaped or char != '"'
            self.escaped = not self.escaped and char == "\\"
            self.done = not self.in_string and self.depth == 0
            return False
        if self.started and self.depth == 0 and (char.isspace() or char in ",}]"):
            return True
        self.started = True
        if char == '"':
            self.in_string = True
        elif char in "{[":
            self.depth += 1
        elif char in "}]":
            self.depth -= 1
            self.done = self.depth == 0
        return False
