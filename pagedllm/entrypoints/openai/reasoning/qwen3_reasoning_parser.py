"""Qwen3: thinks only when the answer opens `<think>` (or the prompt left one open);
`enable_thinking=False` gives an answer with no tags, which is all content."""

from pagedllm.entrypoints.openai.reasoning.abstract_reasoning_parser import ReasoningParser


class Qwen3ReasoningParser(ReasoningParser):
    thinks_first = False
