"""DeepSeek-R1 (and its distills): always thinks first; the chat template of the distills
opens `<think>` in the prompt, so their answers carry only `</think>`."""

from pagedllm.entrypoints.openai.reasoning.abstract_reasoning_parser import ReasoningParser


class DeepSeekR1ReasoningParser(ReasoningParser):
    thinks_first = True
