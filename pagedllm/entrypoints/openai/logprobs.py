"""The engine's logprob dicts in OpenAI's two answer formats: the legacy completions one
(tokens, text offsets, top alternatives by text) and chat's (content entries with bytes)."""

from transformers import PreTrainedTokenizerBase

from pagedllm.entrypoints.openai.responses import (
    ChatCompletionLogProb,
    ChatCompletionLogProbs,
    ChatCompletionLogProbsContent,
    CompletionLogProbs,
)
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


def completion_logprobs(
    tokenizer: PreTrainedTokenizerBase, token_ids: list[int], tops: TopLogprobs, text_offset: int
) -> CompletionLogProbs:
    """OpenAI's legacy logprobs: per token its text, offset, logprob and a dict of the
    top alternatives (text -> logprob) that includes the chosen token."""
    result = CompletionLogProbs()
    for token_id, top in zip(token_ids, tops):
        token = token_text(tokenizer, token_id, top)
        result.tokens.append(token)
        result.text_offset.append(text_offset)
        text_offset += len(token)
        if top is None:
            result.token_logprobs.append(None)
            result.top_logprobs.append(None)
            continue
        result.token_logprobs.append(clamp_logprob(top[token_id].logprob))
        result.top_logprobs.append(
            {token_text(tokenizer, t, top): clamp_logprob(lp.logprob) for t, lp in top.items()}
        )
    return result


def chat_logprobs(
    tokenizer: PreTrainedTokenizerBase,
    token_ids: list[int],
    tops: list[dict[int, Logprob]],
    num_top: int,
) -> ChatCompletionLogProbs:
    """Per token: its text, logprob and bytes, and the `num_top` best alternatives."""
    content = []
    for token_id, top in zip(token_ids, tops):
        ranked = sorted(top.items(), key=lambda item: item[1].rank or 0)
        alternatives = [
            _chat_entry(tokenizer, t, lp, top) for t, lp in ranked if (lp.rank or 0) <= num_top
        ]
        chosen = _chat_entry(tokenizer, token_id, top[token_id], top)
        content.append(
            ChatCompletionLogProbsContent(**chosen.model_dump(), top_logprobs=alternatives)
        )
    return ChatCompletionLogProbs(content=content)


def _chat_entry(
    tokenizer: PreTrainedTokenizerBase, token_id: int, logprob: Logprob, top: dict[int, Logprob]
) -> ChatCompletionLogProb:
    token = token_text(tokenizer, token_id, top)
    return ChatCompletionLogProb(
        token=token, logprob=clamp_logprob(logprob.logprob), bytes=list(token.encode())
    )
