"""N-gram (prompt lookup) drafts, as vLLM's NgramProposer: the tokens that followed an
earlier occurrence of a sequence's last n tokens are guessed to follow them again.

The longest n in [min_n, max_n] whose n-gram occurs earlier wins; of its occurrences, the
first (vLLM's choice), and the draft is up to k of the tokens that came after it, never
past the sequence's end. An occurrence may overlap the suffix itself, but must end before
the sequence's last token, so that at least one token follows it.

The proposer keeps each sequence's tokens as a numpy array grown by the tokens appended
since its last proposal (a sequence's token ids only grow): converting the whole list every
step would cost more than the lookup (~0.4 ms a step for 4,000 tokens).
"""

import weakref

import numpy as np

from pagedllm.config import SpeculativeConfig


def propose_ngram(token_ids: list[int] | np.ndarray, min_n: int, max_n: int, k: int) -> list[int]:
    """Up to k draft tokens for `token_ids` (prompt + output), or [] when no n-gram of
    its suffix with min_n <= n <= max_n occurred before.

    Occurrences are followed by where they end: first every earlier position of the last
    token, then, n growing, those whose n-th token from the end matches too, so the
    sequence is read once and not once per n."""
    num_tokens = len(token_ids)
    if k < 1 or num_tokens <= min_n:
        return []
    tokens = np.asarray(token_ids)
    ends = np.flatnonzero(tokens[: num_tokens - 1] == tokens[num_tokens - 1]) + 1  # ascending
    follow = None
    for n in range(1, min(max_n, num_tokens - 1) + 1):
        if n > 1:
            ends = ends[ends >= n]
            ends = ends[tokens[ends - n] == tokens[num_tokens - n]]
        if not ends.size:
            break
        if n >= min_n:
            follow = int(ends[0])  # the first occurrence of the longest n-gram so far
    return [] if follow is None else tokens[follow : follow + k].tolist()


class _TokenArray:
    """A sequence's token ids as an int64 array, grown in place (capacity doubling)."""

    def __init__(self) -> None:
        self.buffer = np.empty(256, dtype=np.int64)
        self.length = 0

    def view(self, token_ids: list[int]) -> np.ndarray:
        """The array of `token_ids`, which extend the ids of the last call."""
        num_tokens = len(token_ids)
        if num_tokens > len(self.buffer):
            grown = np.empty(max(num_tokens, 2 * len(self.buffer)), dtype=np.int64)
            grown[: self.length] = self.buffer[: self.length]
            self.buffer = grown
        self.buffer[self.length : num_tokens] = token_ids[self.length :]
        self.length = num_tokens
        return self.buffer[:num_tokens]


class NgramProposer:
    """`propose_ngram` with a speculative config's bounds and draft length, over each
    sequence's token array (kept while the sequence object lives)."""

    def __init__(self, config: SpeculativeConfig) -> None:
        self.min_n = config.prompt_lookup_min
        self.max_n = config.prompt_lookup_max
        self.k = config.num_speculative_tokens
        self._arrays: weakref.WeakKeyDictionary[object, _TokenArray] = weakref.WeakKeyDictionary()

    def propose(self, seq: object, token_ids: list[int], max_drafts: int) -> list[int]:
        """At most min(num_speculative_tokens, max_drafts) draft tokens for `seq`, whose
        token ids are `token_ids` (only ever grown between calls for one `seq`)."""
        tokens = self._arrays.setdefault(seq, _TokenArray()).view(token_ids)
        return propose_ngram(tokens, self.min_n, self.max_n, min(self.k, max_drafts))
