"""The generic format's answers (generic_tools.py prompts and constrains them): one JSON
object, `{"tool_calls": [{"name": "f", "arguments": {...}}, ...]}` or
`{"response": "..."}`, or plain text (an answer made without the constraint).

An answer whose first non-space character is `{` is an object: in calls, each call's name
goes out once its `"arguments"` key has been read, then its arguments' JSON text in pieces
as they come (call_stream.py); a reply's string is content, decoded (escapes included) and
streamed as it comes. Any other answer is content, streamed as it comes. An object that is
neither (an answer produced without the constraint, or a call of a name that is not one of
the request's tools) is content at the end, unless the answer ended before its call or reply
began (max_tokens or a stop string: nothing); after a call or the reply, text that does not
follow the shape is dropped."""

import json
import re
from collections.abc import Iterable

from pagedllm.entrypoints.openai.tool_parsers.abstract_tool_parser import (
    ToolParser,
    ToolParserDelta,
)
from pagedllm.entrypoints.openai.tool_parsers.call_stream import (
    CallStream,
    call_object,
    cut_short,
)

_FIRST_CALL = re.compile(r'\s*\{\s*"tool_calls"\s*:\s*\[\s*' + call_object())
_NEXT_CALL = re.compile(r"\s*\}\s*,\s*" + call_object())
_REPLY = re.compile(r'\s*\{\s*"response"\s*:\s*"')
_PLAIN = re.compile(r'[^"\\]+')
_UNDECIDED, _OBJECT, _REPLYING, _CONTENT = "undecided", "object", "replying", "content"


class GenericToolParser(ToolParser):
    def __init__(self, tools: Iterable[str] | None = None) -> None:
        """`tools`: the names a call may have (None: any). The format's prompt shows a
        placeholder name, which a model answering under a request's own constraint may
        copy: such an object is content."""
        super().__init__()
        self.tools = None if tools is None else frozenset(tools)
        self.text = ""
        self.state = _UNDECIDED
        self.calls = CallStream(self, _FIRST_CALL, _NEXT_CALL)
        self.pos = 0  # how far the reply's text has been read
        self.replied = False  # the reply's string has ended

    def feed(self, text: str) -> ToolParserDelta:
        self.text += text
        if self.state == _UNDECIDED:
            start = self.text.lstrip()
            if start:
                self.state = _OBJECT if start.startswith("{") else _CONTENT
        if self.state == _CONTENT:
            content, self.text = self.text, ""
            return ToolParserDelta(content=content)
        if self.state == _OBJECT and not self.num_calls:
            reply = _REPLY.match(self.text)
            if reply is not None:
                self.state, self.pos = _REPLYING, reply.end()
        if self.state == _REPLYING:
            return ToolParserDelta(content=self._read_reply())
        if self.state == _OBJECT:
            return ToolParserDelta(tool_calls=self.calls.read(self.text))
        return ToolParserDelta()

    def finish(self) -> ToolParserDelta:
        if self.state in (_CONTENT, _REPLYING) or self.num_calls:
            return ToolParserDelta()
        if self.state == _OBJECT and any(cut_short(p, self.text) for p in (_FIRST_CALL, _REPLY)):
            return ToolParserDelta()  # a call or reply cut off before it began
        return ToolParserDelta(content=self.text)

    def calls_tool(self, name: str) -> bool:
        return self.tools is None or name in self.tools

    def _read_reply(self) -> str:
        """The reply's characters decoded since the last read; an escape cut off at the end
        of the text waits for the rest."""
        pieces = []
        while not self.replied and self.pos < len(self.text):
            plain = _PLAIN.match(self.text, self.pos)
            if plain is not None:
                pieces.append(plain[0])
                self.pos = plain.end()
            elif self.text[self.pos] == '"':
                self.replied = True
            else:
                length = _escape_length(self.text, self.pos)
                if length is None:
                    break
                pieces.append(_unescaped(self.text[self.pos : self.pos + length]))
                self.pos += length
        return "".join(pieces)


def _escape_length(text: str, pos: int) -> int | None:
    """The length of the JSON escape at `text[pos]` (a backslash), None while cut off: a
    `\\uXXXX` high surrogate takes the `\\uXXXX` after it along."""
    if pos + 1 >= len(text):
        return None
    if text[pos + 1] != "u":
        return 2
    if pos + 6 > len(text):
        return None
    if not "\\ud800" <= text[pos : pos + 6].lower() < "\\udc00":
        return 6
    if pos + 8 > len(text):
        return None
    if text[pos + 6 : pos + 8] != "\\u":
        return 6
    return 12 if pos + 12 <= len(text) else None


def _unescaped(escape: str) -> str:
    """A JSON escape's characters; one that is not valid JSON stays as written."""
    try:
        return json.loads(f'"{escape}"')
    except json.JSONDecodeError:
        return escape
