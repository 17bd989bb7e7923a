"""Tool-call parsers by their `--tool-call-parser` name (vLLM's names, and `generic`: the
format of templates that have none, see generic_tools.py), and the parsers of forced tool
choices."""

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
from pagedllm.entrypoints.openai.tool_parsers.generic_tool_parser import GenericToolParser
from pagedllm.entrypoints.openai.tool_parsers.hermes_tool_parser import Hermes2ProToolParser
from pagedllm.entrypoints.openai.tool_parsers.llama3_json_tool_parser import (
    Llama3JsonToolParser,
)
from pagedllm.entrypoints.openai.tool_parsers.mistral_tool_parser import MistralToolParser

TOOL_PARSERS: dict[str, type[ToolParser]] = {
    "generic": GenericToolParser,
    "hermes": Hermes2ProToolParser,
    "llama3_json": Llama3JsonToolParser,
    "mistral": MistralToolParser,
}


__all__ = [
    "TOOL_PARSERS",
    "ExtractedToolCallInformation",
    "FunctionCall",
    "GenericToolParser",
    "NamedToolParser",
    "RequiredToolParser",
    "ToolCallDelta",
    "ToolParser",
    "ToolParserDelta",
    "join_tool_call_deltas",
]
