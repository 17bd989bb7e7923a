"""Incremental detokenization: text grows token by token, correct across multi-byte chars.

Decoding each token alone loses the spaces and byte pieces that depend on neighbours, and
decoding the whole output every step costs O(n^2). Instead decode a small window: the
text of ids[prefix:] minus the text of ids[prefix:read] is the new text, held back while
it ends in an incomplete UTF-8 sequence (U+FFFD).
"""

from transformers import PreTrainedTokenizerBase

from pagedllm.sampling_params import SamplingParams

PROMPT_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        prompt_token_ids: list[int],
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
    ) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.spaces_between_special_tokens = spaces_between_special_tokens
        self.ids = list(prompt_token_ids[-PROMPT_CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.output_text = ""

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(
            ids,
            skip_special_tokens=self.skip_special_tokens,
            spaces_between_special_tokens=self.spaces_between_special_tokens,
        )

    def add_token(self, token_id: int) -> str:
        """Append one token; return the text it completes (maybe "")."""
        self.ids.append(token_id)
        prefix_text = self._decode(self.ids[self.prefix_offset : self.read_offset])
        new_text = self._decode(self.ids[self.prefix_offset :])
        if len(new_text) <= len(prefix_text) or new_text.endswith("\ufffd"):
            return ""
        delta = new_text[len(prefix_text) :]
        self.ids = self.ids[self.read_offset :]
        self.prefix_offset, self.read_offset = 0, len(self.ids)
        self.output_text += delta
        return delta


def make_detokenizer(
    tokenizer: PreTrainedTokenizerBase | None, prompt_token_ids: list[int], params: SamplingParams
) -> IncrementalDetokenizer | None:
    """One completion's detokenizer, or None when it builds no text."""
    if tokenizer is None or not params.detokenize:
        return None
    return IncrementalDetokenizer(
        tokenizer,
        prompt_token_ids,
        params.skip_special_tokens,
        params.spaces_between_special_tokens,
    )
