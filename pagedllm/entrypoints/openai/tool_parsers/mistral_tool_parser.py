"""Mistral's calls: `[TOOL_CALLS]` then a JSON array of `{"name", "arguments"}` (Mistral
7B v0.3, Mixtral, Nemo), or `[TOOL_CALLS]name[ARGS]{...}` per call (the v11 tokenizer's
templates: Mistral Small 3.2, Magistral).

Text before the first `[TOOL_CALLS]` is content, streamed as it comes. Calls in either
format stream: each name goes out once its arguments begin, then the arguments' JSON text
in pieces as they are generated (call_stream.py); after the calls, text that does not go
on with the next call is dropped. Calls text that never starts so (other key orders) is
held until the answer ends, then read whole: if it is all calls they are the calls, else
it stays content as the model wrote it (as vLLM's mistral parser does)."""

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

_KEYS = "arguments|parameters"
_RAW_NAME = r'(?P<raw_name>[^\s\[\]{}"][^\[\]]*?)\s*\[ARGS\]\s*'  # v11: name[ARGS]
_FIRST_CALL = re.compile(r"\s*(?:(?:\[\s*)?" + call_object(_KEYS) + "|" + _RAW_NAME + ")")
_NEXT_CALL = re.compile(
    r"\s*(?:\}\s*,\s*" + call_object(_KEYS) + r"|\[TOOL_CALLS\]\s*" + _RAW_NAME + ")"
)


class MistralToolParser(ToolParser):
    bot_token = "[TOOL_CALLS]"
    args_token = "[ARGS]"

    def __init__(self) -> None:
        super().__init__()
        self.scanner = TagScanner()
        self.in_calls = False
        self.text = ""  # after the first [TOOL_CALLS]
        self.calls = CallStream(self, _FIRST_CALL, _NEXT_CALL)

    def feed(self, text: str) -> ToolParserDelta:
        self.scanner.add(text)
        delta = ToolParserDelta()
        if not self.in_calls:
            delta.content, self.in_calls = self.scanner.take_until(self.bot_token)
        if self.in_calls:
            self.text += self.scanner.take_all()
            delta.tool_calls = self.calls.read(self.text)
        return delta

    def finish(self) -> ToolParserDelta:
        rest = self.text + self.scanner.take_all()
        if not self.in_calls:
            return ToolParserDelta(content=rest)
        if self.calls.num_calls:
            return ToolParserDelta()
        calls = _parse_calls(rest)
        if calls is None:
            return ToolParserDelta(content=self.bot_token + rest)
        return ToolParserDelta(tool_calls=[self.new_call(call) for call in calls])


def _parse_calls(text: str) -> list[FunctionCall] | None:
    """The calls after `[TOOL_CALLS]`, in either format, or None."""
    text = text.strip()
    if text.startswith(("[", "{")):
        return _parse_json_calls(text)
    calls = []
    for part in text.split(MistralToolParser.bot_token):
        name, found, arguments = part.partition(MistralToolParser.args_token)
        try:
            value = json.loads(arguments)
        except json.JSONDecodeError:
            return None
        if not found or not name.strip():
            return None
        calls.append(FunctionCall(name.strip(), json.dumps(value, ensure_ascii=False)))
    return calls


def _parse_json_calls(text: str) -> list[FunctionCall] | None:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    values = value if isinstance(value, list) else [value]
    calls = [as_function_call(v, ("arguments", "parameters")) for v in values]
    return None if not calls or None in calls else calls
