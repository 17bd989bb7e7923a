"""N-gram (prompt lookup) drafts, as vLLM's NgramProposer: the tokens that followed an
earlier occurrence of a sequence's last n tokens are guessed to follow them again.

The longest n in [min_n, max_n] whose n-gram occurs earlier wins; of its occurrences, the
first (vLLM's choice), and the draft is up to k of the tokens that came after it, never
past the sequence's end. An occurrence may overlap the suffix itself, but must end before
the sequence's last token, so that at least one token follows it.
"""

import numpy as np

from pagedllm.config import SpeculativeConfig


def propose_ngram(token_ids: list[int], min_n: int, max_n: int, k: int) -> list[int]:
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
    return [] if follow is None else token_ids[follow : follow + k]


class NgramProposer:
    """`propose_ngram` with a speculative config's bounds and draft length."""

    def __init__(self, config: SpeculativeConfig) -> None:
        self.min_n = config.prompt_lookup_min
        self.max_n = config.prompt_lookup_max
        self.k = config.num_speculative_tokens

    def propose(self, token_ids: list[int], max_drafts: int) -> list[int]:
        """At most min(num_speculative_tokens, max_drafts) draft tokens."""
        return propose_ngram(token_ids, self.min_n, self.max_n, min(self.k, max_drafts))
