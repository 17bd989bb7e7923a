"""Hermes-style calls (Qwen2.5, Qwen3, Hermes 2 Pro):
`<tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>`, one block per call.

Text outside the blocks is content, less the whitespace around the calls. A block whose
body starts `{"name": "f", "arguments": ` streams as vLLM's parser does: the call's name
goes out then, its arguments' JSON text in pieces as they are generated (call_stream.py),
and what follows the arguments in the block is dropped. Any other block is read whole
when it closes (or the answer ends): a call if its body is a call's JSON, else it stays in
the content as the model wrote it."""

import json
import re

from pagedllm.entrypoints.openai.reasoning.tag_scanner import TagScanner
from pagedllm.entrypoints.openai.tool_parsers.abstract_tool_parser import (
    FunctionCall,
    ToolParser,
    ToolParserDelta,
    as_function_call,
)
from pagedllm.entrypoints.openai.tool_parsers.call_stream import CallStream, call_object

_CALL = re.compile(r"\s*" + call_object())


class Hermes2ProToolParser(ToolParser):
    tool_call_start_token = "<tool_call>"
    tool_call_end_token = "</tool_call>"

    def __init__(self) -> None:
        super().__init__()
        self.scanner = TagScanner()
        self.block: CallStream | None = None  # the open block's call, while in a block
        self.body = ""  # the open block's text so far
        self.spaces = ""  # whitespace at the end of the content so far, not sent yet
        self.after_call = False  # no content sent since the last call

    def feed(self, text: str) -> ToolParserDelta:
        self.scanner.add(text)
        delta = ToolParserDelta()
        while True:
            tag = self.tool_call_start_token if self.block is None else self.tool_call_end_token
            released, found = self.scanner.take_until(tag)
            if self.block is None:
                delta.content += self._content(released)
            else:
                self._extend_block(released, delta)
            if not found:
                return delta
            if self.block is None:
                self.block = CallStream(self, _CALL)
            else:
                self._close_block(delta)

    def finish(self) -> ToolParserDelta:
        delta = ToolParserDelta()
        rest = self.scanner.take_all()
        if self.block is not None:
            self._extend_block(rest, delta)
            self._close_block(delta, closed=False)
        else:
            delta.content += self._content(rest)
        if self.num_calls == 0:
            delta.content += self.spaces
        return delta

    def _extend_block(self, text: str, delta: ToolParserDelta) -> None:
        self.body += text
        calls = self.block.read(self.body)
        if any(call.name is not None for call in calls):  # the content before it is done
            self.spaces, self.after_call = "", True
        delta.tool_calls += calls

    def _close_block(self, delta: ToolParserDelta, closed: bool = True) -> None:
        streamed = self.block.num_calls
        self.block, body, self.body = None, self.body, ""
        if streamed:
            return
        call = _parse_call(body)
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
