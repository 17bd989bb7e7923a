"""Llama 3.1/3.2's JSON calls: the answer is `{"name": "f", "parameters": {...}}` (or
"arguments"), optionally after `<|python_tag|>`, several separated by `;`.

An answer that starts (after whitespace) with `{` or the tag is held until it ends, then
read whole: if every part is a call they are the calls, else the whole answer is content
(as vLLM's llama3_json). Any other answer is content, streamed as it comes."""

import json

from pagedllm.entrypoints.openai.tool_parsers.abstract_tool_parser import (
    FunctionCall,
    ToolParser,
    ToolParserDelta,
    as_function_call,
)

_UNDECIDED, _CALLS, _CONTENT = "undecided", "calls", "content"


class Llama3JsonToolParser(ToolParser):
    bot_token = "<|python_tag|>"

    def __init__(self) -> None:
        super().__init__()
        self.text = ""
        self.state = _UNDECIDED

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
        return ToolParserDelta()

    def finish(self) -> ToolParserDelta:
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
