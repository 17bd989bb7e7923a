"""apply_bad_words against the rule: ban a word's last token when the output ends with its
other tokens (vLLM's sample/ops/bad_words.py)."""

import torch

from pagedllm.sample.ops.bad_words import apply_bad_words


def test_bans_last_token_only_after_matching_prefix() -> None:
    logits = torch.zeros(3, 10)
    bad = {0: [[7], [1, 2, 3]], 1: [[1, 2, 3], [4, 5]], 2: [[9, 8]]}
    past = [[5, 1, 2], [1, 2, 4], []]
    apply_bad_words(logits, bad, past)
    banned = {tuple(rc) for rc in torch.nonzero(logits.isinf()).tolist()}
    assert banned == {(0, 7), (0, 3), (1, 5)}
    assert (logits[logits.isinf()] < 0).all()


def test_no_bad_words_leaves_logits_alone() -> None:
    logits = torch.randn(2, 5)
    assert torch.equal(apply_bad_words(logits.clone(), {}, [[1], [2]]), logits)
