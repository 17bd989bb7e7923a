"""N-gram (prompt lookup) drafts, as vLLM's NgramProposer: the tokens that followed an
earlier occurrence of a sequence's last n tokens are guessed to follow them again.

The longest n in [min_n, max_n] whose n-gram occurs earlier wins; of its occurrences, the
first (vLLM's choice), and the draft is up to k of the tokens that came after it, never
past the sequence's end. An occurrence may overlap the suffix itself, but must end before
the sequence's last token, so that at least one token follows it.
"""

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from pagedllm.config import SpeculativeConfig


def propose_ngram(token_ids: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """Up to k draft tokens for `token_ids` (prompt + output), or [] when no n-gram of
    its suffix with min_n <= n <= max_n occurred before."""
    num_tokens = len(token_ids)
    if k < 1 or num_tokens <= min_n:
        return []
    tokens = np.asarray(token_ids)
    for n in range(min(max_n, num_tokens - 1), min_n - 1, -1):
        windows = sliding_window_view(tokens[: num_tokens - 1], n)  # [num_tokens - n, n]
        starts = np.flatnonzero((windows == tokens[num_tokens - n :]).all(axis=1))
        if starts.size:
            follow = int(starts[0]) + n
            return token_ids[follow : follow + k]
    return []


class NgramProposer:
    """`propose_ngram` with a speculative config's bounds and draft length."""

    def __init__(self, config: SpeculativeConfig) -> None:
        self.min_n = config.prompt_lookup_min
        self.max_n = config.prompt_lookup_max
        self.k = config.num_speculative_tokens

    def propose(self, token_ids: list[int], max_drafts: int) -> list[int]:
        """At most min(num_speculative_tokens, max_drafts) draft tokens."""
        return propose_ngram(token_ids, self.min_n, self.max_n, min(self.k, max_drafts))
