"""Llama 3.1/3.2's JSON calls: the answer is `{"name": "f", "parameters": {...}}` (or
"arguments"), optionally after `<|python_tag|>`, several separated by `;`.

An answer that starts (after whitespace) with `{` or the tag is calls. Calls that start
`{"name": "f", "parameters": ` stream: each name goes out then, its arguments' JSON text in
pieces as they are generated (call_stream.py); after the calls, text that does not go on
with `; {"name": ...` is dropped. Calls text that never starts so (other key orders) is
held until the answer ends, then read whole: if every part is a call they are the calls,
else the whole answer is content (as vLLM's llama3_json). Any other answer is content,
streamed as it comes."""

import json
import re

from pagedllm.entrypoints.openai.tool_parsers.abstract_tool_parser import (
    FunctionCall,
    ToolParser,
    ToolParserDelta,
    as_function_call,
)
from pagedllm.entrypoints.openai.tool_parsers.call_stream import CallStream, call_object

_KEYS = "arguments|parameters"
_FIRST_CALL = re.compile(r"\s*(?:<\|python_tag\|>)?\s*" + call_object(_KEYS))
_NEXT_CALL = re.compile(r"\s*\}\s*;\s*" + call_object(_KEYS))
_UNDECIDED, _CALLS, _CONTENT = "undecided", "calls", "content"


class Llama3JsonToolParser(ToolParser):
    bot_token = "<|python_tag|>"

    def __init__(self) -> None:
        super().__init__()
        self.text = ""
        self.state = _UNDECIDED
        self.calls = CallStream(self, _FIRST_CALL, _NEXT_CALL)

    def feed(self, text: str) -> ToolParserDelta:
        self.text += text
        if self.state == _UNDECIDED:
            start = self.text.lstrip()
            if start.startswith(("{", self.bot_token)):
                self.state = _CALLS
            elif start and not self.bot_token.startswith(start):
                self.state = _CONTENT
        if self.state == _CONTENT:
            content, self.text = self.text, ""
            return ToolParserDelta(content=content)
        if self.state == _CALLS:
            return ToolParserDelta(tool_calls=self.calls.read(self.text))
        return ToolParserDelta()

    def finish(self) -> ToolParserDelta:
        if self.calls.num_calls:
            return ToolParserDelta()
        calls = _parse_calls(self.text) if self.state == _CALLS else None
        if calls is None:
            return ToolParserDelta(content=self.text)
        return ToolParserDelta(tool_calls=[self.new_call(call) for call in calls])


def _parse_calls(text: str) -> list[FunctionCall] | None:
    """The `;`-separated calls making up `text` (after the tag), or None."""
    text = text.strip().removeprefix(Llama3JsonToolParser.bot_token)
    decoder, calls, pos = json.JSONDecoder(), [], 0
    while True:
        pos = len(text) - len(text[pos:].lstrip())
        try:
            value, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return None
        call = as_function_call(value, ("arguments", "parameters"))
        if call is None:
            return None
        calls.append(call)
        rest = text[pos:].lstrip()
        if not rest:
            return calls
        if not rest.startswith(";"):
            return None
        pos = len(text) - len(rest) + 1
