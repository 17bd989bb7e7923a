"""ReasoningParser: a chat answer's `<think>...</think>` part split from its content, from
the whole text or piece by piece (vLLM's `--reasoning-parser`).

The parsers differ only in how an answer starts. A model that always thinks first
(DeepSeek-R1: `thinks_first`) is in its reasoning from its first token, whether or not it
writes `<think>` itself (R1-Distill's chat template already opens `<think>` in the
prompt, so the output has only the closing tag). Otherwise (Qwen3) the answer is reasoning
only if it opens with `<think>`, or if the prompt ends with `<think>` (Qwen3's thinking-only
templates), or if the answer continues a final message (`continue_final_message`) that
opened a think part and did not close it; a tag elsewhere in the prompt (a user's text, an
earlier turn cut off in its reasoning) says nothing about the answer.
`enable_thinking=False` templates close the empty think part in the prompt, so the answer
is all content. A reasoning part the answer never closes (it ran
out of tokens) is all reasoning, in both parsers and both modes.

`reasoning_tokens` tells the engine the same in token ids, so that structured outputs
constrain only the content after the reasoning part.
"""

from dataclasses import dataclass

from pagedllm.entrypoints.openai.reasoning.tag_scanner import TagScanner
from pagedllm.sampling_params import ReasoningTokens, Tokenizer

# Where the parser is in the answer.
_OPENING = "opening"  # before the first non-space text: a `<think>` may open reasoning
_REASONING = "reasoning"
_CONTENT = "content"


@dataclass
class ReasoningDelta:
    reasoning: str = ""
    content: str = ""


class ReasoningParser:
    start_token = "<think>"
    end_token = "</think>"
    thinks_first = False

    def __init__(self, prompt: str = "", prefill: str | None = None) -> None:
        """`prompt`: the rendered prompt text, whose end may already open `<think>`;
        `prefill`: the final message's text the answer continues, if it continues one."""
        self.in_reasoning = self.thinks_first or self._opened(prompt, prefill)
        self.state = _OPENING
        self.scanner = TagScanner()

    @classmethod
    def _opened(cls, prompt: str, prefill: str | None) -> bool:
        """Whether the answer starts inside a think part the prompt opened."""
        if prefill is not None:
            return prefill.rfind(cls.start_token) > prefill.rfind(cls.end_token)
        return prompt.rstrip().endswith(cls.start_token)

    @classmethod
    def reasoning_tokens(
        cls, prompt: str, tokenizer: Tokenizer, prefill: str | None = None
    ) -> ReasoningTokens | None:
        """Where the answer to `prompt` has its reasoning part, as the parser reads it: from
        the first token (thinking first, or the prompt opened `<think>`), or where the
        answer opens with `<think>`; None when the prompt closed it (`enable_thinking`
        false), so a constraint applies from the first token."""
        end_ids = tokenizer.encode(cls.end_token, add_special_tokens=False)
        if cls(prompt, prefill).in_reasoning:
            return ReasoningTokens(end_ids, in_reasoning=True)
        start_ids = tokenizer.encode(cls.start_token, add_special_tokens=False)
        if prompt.rstrip().endswith(cls.end_token) or len(start_ids) != 1:
            return None
        return ReasoningTokens(end_ids, in_reasoning=False, start_token_id=start_ids[0])

    def feed(self, text: str) -> ReasoningDelta:
        """The reasoning and content that `text`, the answer's next piece, settles."""
        self.scanner.add(text)
        delta = ReasoningDelta()
        if self.state == _OPENING:
            self._open()
        if self.state == _REASONING:
            released, closed = self.scanner.take_until(self.end_token)
            delta.reasoning = released
            if closed:
                self.state = _CONTENT
        if self.state == _CONTENT:
            delta.content = self.scanner.take_all()
        return delta

    def finish(self) -> ReasoningDelta:
        """What is held back once the answer has ended."""
        rest = self.scanner.take_all()
        if self.state == _CONTENT or (self.state == _OPENING and not self.in_reasoning):
            return ReasoningDelta(content=rest)
        return ReasoningDelta(reasoning=rest)

    def extract_reasoning_content(self, model_output: str) -> tuple[str | None, str | None]:
        """(reasoning, content) of a whole answer, None for an empty part."""
        first, last = self.feed(model_output), self.finish()
        reasoning, content = first.reasoning + last.reasoning, first.content + last.content
        return reasoning or None, content or None

    def _open(self) -> None:
        """Leave _OPENING once the answer's start shows whether it opens with `<think>`."""
        start = self.scanner.buffer.lstrip()
        if start.startswith(self.start_token):
            self.scanner.buffer = start[len(self.start_token) :]
            self.state = _REASONING
        elif not self.start_token.startswith(start):
            self.state = _REASONING if self.in_reasoning else _CONTENT
