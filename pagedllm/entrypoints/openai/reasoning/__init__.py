"""Reasoning parsers by their `--reasoning-parser` name (vLLM's names)."""

from pagedllm.entrypoints.openai.reasoning.abstract_reasoning_parser import (
    ReasoningDelta,
    ReasoningParser,
)
from pagedllm.entrypoints.openai.reasoning.deepseek_r1_reasoning_parser import (
    DeepSeekR1ReasoningParser,
)
from pagedllm.entrypoints.openai.reasoning.qwen3_reasoning_parser import Qwen3ReasoningParser

REASONING_PARSERS: dict[str, type[ReasoningParser]] = {
    "deepseek_r1": DeepSeekR1ReasoningParser,
    "qwen3": Qwen3ReasoningParser,
}


__all__ = ["REASONING_PARSERS", "ReasoningDelta", "ReasoningParser"]
