"""Hermes-style calls (Qwen2.5, Qwen3, Hermes 2 Pro):
`<tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>`, one block per call.

Text outside the blocks is content, less the whitespace around the calls. A block whose
body is not a call's JSON stays in the content as the model wrote it; a block the answer
never closes is read as far as it goes (a call if its body parses), as vLLM does."""

import json

from pagedllm.entrypoints.openai.reasoning.tag_scanner import TagScanner
from pagedllm.entrypoints.openai.tool_parsers.abstract_tool_parser import (
    FunctionCall,
    ToolParser,
    ToolParserDelta,
    as_function_call,
)


class Hermes2ProToolParser(ToolParser):
    tool_call_start_token = "<tool_call>"
    tool_call_end_token = "</tool_call>"

    def __init__(self) -> None:
        super().__init__()
        self.scanner = TagScanner()
        self.in_call = False
        self.body = ""  # the open block's text so far
        self.spaces = ""  # whitespace at the end of the content so far, not sent yet
        self.after_call = False  # no content sent since the last call

    def feed(self, text: str) -> ToolParserDelta:
        self.scanner.add(text)
        delta = ToolParserDelta()
        while True:
            tag = self.tool_call_end_token if self.in_call else self.tool_call_start_token
            released, found = self.scanner.take_until(tag)
            if self.in_call:
                self.body += released
            else:
                delta.content += self._content(released)
            if not found:
                return delta
            if self.in_call:
                self._close_block(delta)
            else:
                self.in_call = True

    def finish(self) -> ToolParserDelta:
        delta = ToolParserDelta()
        rest = self.scanner.take_all()
        if self.in_call:
            self.body += rest
            self._close_block(delta, closed=False)
        else:
            delta.content += self._content(rest)
        if self.num_calls == 0:
            delta.content += self.spaces
        return delta

    def _close_block(self, delta: ToolParserDelta, closed: bool = True) -> None:
        call = _parse_call(self.body)
        self.in_call, body, self.body = False, self.body, ""
        if call is not None:
            delta.tool_calls.append(self.new_call(call))
            self.spaces, self.after_call = "", True
        else:
            end = self.tool_call_end_token if closed else ""
            delta.content += self._content(self.tool_call_start_token + body + end)

    def _content(self, text: str) -> str:
        """`text` to send as content, less the whitespace right after a call, holding back
        its trailing whitespace (dropped if a call follows it)."""
        text = self.spaces + text
        if self.after_call:
            text = text.lstrip()
            self.after_call = not text
        stripped = text.rstrip()
        self.spaces = text[len(stripped) :]
        return stripped


def _parse_call(body: str) -> FunctionCall | None:
    try:
        value = json.loads(body)
    except json.JSONDecodeError:
        return None
    return as_function_call(value, ("arguments",))
