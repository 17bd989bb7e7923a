"""N-gram drafts (pagedllm/spec_decode/ngram_proposer.py). Reference: lists worked out by
hand from vLLM's rule (the longest suffix n-gram in [min_n, max_n] that occurred before the
last token, its first occurrence, up to k of the tokens after it)."""

import random

import pytest

from pagedllm.config import SpeculativeConfig
from pagedllm.spec_decode.ngram_proposer import NgramProposer, propose_ngram


@pytest.mark.parametrize(
    "tokens, min_n, max_n, k, expected",
    [
        # "1 2" occurred at 0: the three tokens after it.
        ([1, 2, 3, 4, 1, 2], 1, 3, 3, [3, 4, 1]),
        # Of two occurrences of "1 2", the first (not the most recent, [6, 1, 2]).
        ([1, 2, 5, 1, 2, 6, 1, 2], 1, 2, 3, [5, 1, 2]),
        # The longest n wins: "1 2" at 3, not "2" at 1 (which would give [9, 1, 2]).
        ([7, 2, 9, 1, 2, 8, 3, 1, 2], 1, 3, 3, [8, 3, 1]),
        # The draft stops at the sequence's end.
        ([1, 2, 3, 1, 2], 1, 2, 5, [3, 1, 2]),
        # An occurrence may overlap the suffix, but ends before the last token.
        ([4, 4, 4, 4], 1, 3, 2, [4]),
        # min_n: "6" occurred, but no 2- or 3-gram did.
        ([5, 6, 1, 7, 6], 2, 3, 3, []),
        ([5, 6, 1, 7, 6], 1, 3, 3, [1, 7, 6]),
        # max_n: "1 2" first at 0; "3 1 2" (at 3) counts only with max_n 3.
        ([1, 2, 9, 3, 1, 2, 5, 3, 1, 2], 1, 2, 2, [9, 3]),
        ([1, 2, 9, 3, 1, 2, 5, 3, 1, 2], 1, 3, 2, [5, 3]),
        # Nothing to match.
        ([1, 2, 3], 1, 3, 3, []),
        ([1, 1], 2, 2, 3, []),
        ([1, 1, 1], 1, 1, 0, []),
    ],
)
def test_propose_ngram_matches_hand_worked_drafts(tokens, min_n, max_n, k, expected) -> None:
    assert propose_ngram(tokens, min_n, max_n, k) == expected


def test_proposer_takes_the_config_and_the_callers_limit() -> None:
    config = SpeculativeConfig(num_speculative_tokens=3, prompt_lookup_min=1, prompt_lookup_max=2)
    proposer = NgramProposer(config)
    tokens = [1, 2, 3, 4, 5, 6, 1, 2]
    seq = Owner()
    assert proposer.propose(seq, tokens, max_drafts=10) == [3, 4, 5]
    assert proposer.propose(seq, tokens, max_drafts=1) == [3]


class Owner:
    """Stands for a Sequence: the proposer keys its token arrays by the object."""


def test_a_sequences_array_grows_with_its_tokens() -> None:
    """Proposals over a sequence's growing ids (its array extended, past the first
    capacity) equal proposals over the whole list each time; another sequence has its own."""
    config = SpeculativeConfig(num_speculative_tokens=4, prompt_lookup_min=1, prompt_lookup_max=3)
    proposer, rng = NgramProposer(config), random.Random(1)
    seq, other = Owner(), Owner()
    tokens = [rng.randrange(5) for _ in range(10)]
    for _ in range(400):
        tokens += [rng.randrange(5) for _ in range(rng.randint(1, 3))]
        assert proposer.propose(seq, tokens, 4) == propose_ngram(tokens, 1, 3, 4)
        assert proposer.propose(other, [7, 8, 7], 4) == [8, 7]


def brute_force(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """The rule read literally: for n from max_n down, the first start s with
    tokens[s:s + n] == the last n tokens and s + n < len(tokens)."""
    for n in range(max_n, min_n - 1, -1):
        for s in range(len(tokens) - n):
            if n < len(tokens) and tokens[s : s + n] == tokens[-n:]:
                return tokens[s + n : s + n + k] if k > 0 else []
    return []


def test_propose_ngram_matches_the_rule_read_literally_on_random_sequences() -> None:
    rng = random.Random(0)
    for _ in range(2000):
        tokens = [rng.randrange(4) for _ in range(rng.randint(1, 30))]
        min_n = rng.randint(1, 4)
        max_n, k = rng.randint(min_n, 5), rng.randint(0, 5)
        assert propose_ngram(tokens, min_n, max_n, k) == brute_force(tokens, min_n, max_n, k)
