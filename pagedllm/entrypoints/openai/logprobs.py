"""The engine's logprob dicts in OpenAI's two answer formats: the legacy completions one
(tokens, text offsets, top alternatives by text) and chat's (content entries with bytes)."""

from transformers import PreTrainedTokenizerBase

from pagedllm.engine.detokenizer import IncrementalDetokenizer
from pagedllm.entrypoints.openai.responses import (
    ChatCompletionLogProb,
    ChatCompletionLogProbs,
    ChatCompletionLogProbsContent,
    CompletionLogProbs,
)
from pagedllm.entrypoints.openai.token_bytes import token_bytes
from pagedllm.outputs import Logprob

TopLogprobs = list[dict[int, Logprob] | None]

# JSON has no -inf; OpenAI's clients expect a number (vLLM's choice of floor).
MIN_LOGPROB = -9999.0


def clamp_logprob(logprob: float) -> float:
    return max(logprob, MIN_LOGPROB)


def token_text(
    tokenizer: PreTrainedTokenizerBase, token_id: int, top: dict[int, Logprob] | None
) -> str:
    """The engine's decoded text of the token when it has it, else the tokenizer's."""
    entry = top.get(token_id) if top is not None else None
    if entry is not None and entry.decoded_token is not None:
        return entry.decoded_token
    return tokenizer.decode([token_id])


def token_id_name(token_id: int) -> str:
    """vLLM's `return_tokens_as_token_ids` name of a token: exact where its text is not
    (a piece of a character decodes to U+FFFD; tokens may share a text)."""
    return f"token_id:{token_id}"


def _token_name(
    tokenizer: PreTrainedTokenizerBase,
    token_id: int,
    top: dict[int, Logprob] | None,
    as_token_ids: bool,
) -> str:
    return token_id_name(token_id) if as_token_ids else token_text(tokenizer, token_id, top)


class TextOffsets:
    """Where each token's text starts in a choice's text (OpenAI's `text_offset`): the
    characters the tokens before it completed, counted as the engine's detokenizer builds
    the text (the pieces of one character all start where it does), so a stream's offsets
    are the whole answer's and none passes the end of the text."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        context_ids: list[int],
        start: int,
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
    ) -> None:
        """The offsets of tokens that follow `context_ids`, from `start`; the flags are the
        request's, which its text was built with."""
        self.detokenizer = IncrementalDetokenizer(
            tokenizer, context_ids, skip_special_tokens, spaces_between_special_tokens
        )
        self.position = start

    def of(self, token_ids: list[int]) -> list[int]:
        """The offsets of the next tokens."""
        offsets = []
        for token_id in token_ids:
            offsets.append(self.position)
            self.position += len(self.detokenizer.add_token(token_id))
        return offsets


def completion_logprobs(
    tokenizer: PreTrainedTokenizerBase,
    token_ids: list[int],
    tops: TopLogprobs,
    text_offsets: list[int],
    as_token_ids: bool = False,
) -> CompletionLogProbs:
    """OpenAI's legacy logprobs: per token its text, offset (TextOffsets'), logprob and a
    dict of the top alternatives (text -> logprob) that includes the chosen token.
    `as_token_ids`: tokens are named `token_id:<id>` instead of by their text."""
    result = CompletionLogProbs()
    for token_id, top, text_offset in zip(token_ids, tops, text_offsets):
        token = _token_name(tokenizer, token_id, top, as_token_ids)
        result.tokens.append(token)
        result.text_offset.append(text_offset)
        if top is None:
            result.token_logprobs.append(None)
            result.top_logprobs.append(None)
            continue
        result.token_logprobs.append(clamp_logprob(top[token_id].logprob))
        result.top_logprobs.append(
            {
                _token_name(tokenizer, t, top, as_token_ids): clamp_logprob(lp.logprob)
                for t, lp in top.items()
            }
        )
    return result


def chat_logprobs(
    tokenizer: PreTrainedTokenizerBase,
    token_ids: list[int],
    tops: list[dict[int, Logprob]],
    num_top: int,
    as_token_ids: bool = False,
) -> ChatCompletionLogProbs:
    """Per token: its text, logprob and bytes, and the `num_top` best alternatives.
    `as_token_ids`: tokens are named `token_id:<id>`; their bytes stay the token's own."""
    content = []
    for token_id, top in zip(token_ids, tops):
        # OpenAI's top_logprobs: the num_top most likely, never more (tied values too).
        ranked = sorted(top.items(), key=lambda item: (-item[1].logprob, item[1].rank or 0))
        alternatives = [
            _chat_entry(tokenizer, t, lp, top, as_token_ids) for t, lp in ranked[:num_top]
        ]
        chosen = _chat_entry(tokenizer, token_id, top[token_id], top, as_token_ids)
        content.append(
            ChatCompletionLogProbsContent(**chosen.model_dump(), top_logprobs=alternatives)
        )
    return ChatCompletionLogProbs(content=content)


def _chat_entry(
    tokenizer: PreTrainedTokenizerBase,
    token_id: int,
    logprob: Logprob,
    top: dict[int, Logprob],
    as_token_ids: bool,
) -> ChatCompletionLogProb:
    text = token_text(tokenizer, token_id, top)
    raw = token_bytes(tokenizer, token_id, text)
    token = token_id_name(token_id) if as_token_ids else text
    logprob_value = clamp_logprob(logprob.logprob)
    return ChatCompletionLogProb(token=token, logprob=logprob_value, bytes=list(raw))
