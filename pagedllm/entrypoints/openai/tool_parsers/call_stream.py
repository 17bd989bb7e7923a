"""CallStream: tool calls read out of an answer while it is generated, shared by the
parsers whose calls are `{"name": ..., "arguments": <JSON value>}` objects (hermes,
llama3_json, mistral, generic, a required tool choice) or `name[ARGS]<JSON value>`
(mistral's v11 format).

A call's name goes out as soon as the text up to its arguments' value has been read (the
`first` pattern for the stream's first call, `following` for each next one), then the
arguments' JSON text in pieces as they come, up to where the value ends (ValueScanner).
The pieces are the model's own text, so the streamed arguments add up to exactly what the
whole answer gives. Arguments written as a JSON string (JSON text inside a string) go out
decoded, at once when the string ends. Whatever follows the last call that the patterns do
not match is the parser's to judge (it stays in the text, from `pos`)."""

import json
import re

import regex

from pagedllm.entrypoints.openai.tool_parsers.abstract_tool_parser import (
    ToolCallDelta,
    ToolParser,
)

_JSON_NAME = r'(?P<name>"(?:[^"\\]|\\.)*")'


def call_object(keys: str = "arguments") -> str:
    """The pattern of a call object's text up to its arguments' value: `{"name": "f",
    "<key>": ` for one of the `|`-separated keys."""
    return r'\{\s*"name"\s*:\s*' + _JSON_NAME + r'\s*,\s*"(?:' + keys + r')"\s*:\s*'


class CallStream:
    def __init__(
        self, parser: ToolParser, first: re.Pattern, following: re.Pattern | None = None
    ) -> None:
        """`first` and `following` match from where the stream has read to the start of a
        call's arguments, naming it in group `name` (JSON text) or `raw_name` (bare)."""
        self.parser = parser
        self.first = first
        self.following = following
        self.pos = 0  # how far the text has been read
        self.num_calls = 0  # the calls this stream has announced
        self.arguments: _Arguments | None = None  # the open call's

    def read(self, text: str) -> list[ToolCallDelta]:
        """The deltas that `text` (all of the text so far: it only grows) settles; each
        call's index follows the parser's calls before it."""
        deltas: list[ToolCallDelta] = []
        while True:
            if self.arguments is not None:
                piece, self.pos = self.arguments.read(text, self.pos)
                index = self.parser.num_calls - 1
                if deltas and deltas[-1].index == index:  # its name went out in this read
                    deltas[-1].arguments += piece
                elif piece:
                    deltas.append(ToolCallDelta(index, arguments=piece))
                if not self.arguments.done:
                    return deltas
                self.arguments = None
            pattern = self.following if self.num_calls else self.first
            match = pattern.match(text, self.pos) if pattern is not None else None
            name = _name(match) if match is not None else None
            if name is None or not self.parser.calls_tool(name):
                return deltas
            self.pos = match.end()
            self.num_calls += 1
            self.parser.num_calls += 1
            self.arguments = _Arguments()
            deltas.append(ToolCallDelta(self.parser.num_calls - 1, name))


def cut_short(pattern: re.Pattern, text: str) -> bool:
    """Whether the answer `text` ended before a match of `pattern` was complete: all of it
    is the start of a text `pattern` matches (a call cut off by max_tokens or a stop string
    before its arguments began), so it is no content either."""
    match = regex.fullmatch(pattern.pattern, text, partial=True)
    return match is not None and match.partial


def _name(match: re.Match) -> str:
    groups = match.groupdict()
    if groups.get("name") is not None:
        return json.loads(groups["name"])
    return groups["raw_name"].strip()


class _Arguments:
    """One call's arguments, read a piece at a time."""

    def __init__(self) -> None:
        self.scanner = ValueScanner()
        self.string: str | None = None  # a string value's text so far

    @property
    def done(self) -> bool:
        return self.scanner.done

    def read(self, text: str, pos: int) -> tuple[str, int]:
        """(the arguments' next piece, where reading stopped) from `text[pos:]`."""
        if not self.scanner.started:  # skip the spaces before the value
            pos = len(text) - len(text[pos:].lstrip())
            if text[pos : pos + 1] == '"':
                self.string = ""
        end = self.scanner.scan(text, pos)
        piece = text[pos:end]
        if self.string is None:
            return piece, end
        self.string += piece
        return (_decoded(self.string) if self.done else ""), end


def _decoded(string: str) -> str:
    """The JSON text a JSON string holds (the string as written if it does not decode)."""
    try:
        return json.loads(string)
    except json.JSONDecodeError:
        return string


class ValueScanner:
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
