"""Tool-call parsers by their `--tool-call-parser` name (vLLM's names), and the parsers of
forced tool choices."""

from pagedllm.entrypoints.openai.tool_parsers.abstract_tool_parser import (
    ExtractedToolCallInformation,
    FunctionCall,
    ToolCallDelta,
    ToolParser,
    ToolParserDelta,
    join_tool_call_deltas,
)
from pagedllm.entrypoints.openai.tool_parsers.forced_tool_parsers import (
    NamedToolParser,
    RequiredToolParser,
)
from pagedllm.entrypoints.openai.tool_parsers.hermes_tool_parser import Hermes2ProToolParser
from pagedllm.entrypoints.openai.tool_parsers.llama3_json_tool_parser import (
    Llama3JsonToolParser,
)

TOOL_PARSERS: dict[str, type[ToolParser]] = {
    "hermes": Hermes2ProToolParser,
    "llama3_json": Llama3JsonToolParser,
}


__all__ = [
    "TOOL_PARSERS",
    "ExtractedToolCallInformation",
    "FunctionCall",
    "NamedToolParser",
    "RequiredToolParser",
    "ToolCallDelta",
    "ToolParser",
    "ToolParserDelta",
    "join_tool_call_deltas",
]
