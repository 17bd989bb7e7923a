"""Bad words: ban a word's last token when the output so far ends with the rest of it."""

import torch

from pagedllm.device_copy import to_device


def apply_bad_words(
    logits: torch.Tensor,
    bad_words_token_ids: dict[int, list[list[int]]],
    past_tokens_ids: list[list[int]],
) -> torch.Tensor:
    """Set logits [B, V] to -inf in place where a bad word would be completed.

    bad_words_token_ids: row -> that row's bad words as token id lists. A word of n tokens
    is banned at row i when the last n - 1 of past_tokens_ids[i] equal its first n - 1, so
    a one-token word is always banned. The Python loop runs only over rows with bad words.
    """
    banned = []
    for row, words in bad_words_token_ids.items():
        past = past_tokens_ids[row]
        for word in words:
            prefix = word[:-1]
            if len(prefix) <= len(past) and past[len(past) - len(prefix) :] == prefix:
                banned.append((row, word[-1]))
    if banned:
        rows, tokens = to_device(banned, torch.long, logits.device).T
        logits[rows, tokens] = float("-inf")
    return logits
