"""Verification of draft tokens: which of them the target model accepts, and its token
after them (vLLM's RejectionSampler, for drafts without probabilities).

The sampler draws a token y_j ~ p_j at every verified position j, p_j being the target
distribution there after the row's own processing (temperature, top-k, top-p, min-p,
logit_bias, allowed_token_ids; argmax for greedy rows), as a step without drafts would.
The draft x_j is accepted when y_j == x_j, and the first y_j that differs is emitted in its
place (after all d drafts, y_d is the bonus token). This is speculative rejection sampling
with a one-hot draft distribution q = onehot(x): x is accepted with probability
min(1, p(x) / q(x)) = p(x), and on rejection the token is y conditioned on y != x, which
is p with x removed and renormalised: the residual max(p - q, 0) normalised. So every
emitted token has the distribution p_j given the tokens before it, the distribution of
decoding without drafts; a greedy row emits exactly the argmax tokens.
"""


def accepted_tokens(sampled: list[int], draft_token_ids: list[int]) -> list[int]:
    """The tokens a sequence appends: `sampled` [d + 1], the target's token at its last
    known token and at each of its d drafts, up to and including the first that differs
    from the draft it verifies (all d + 1 when every draft is accepted)."""
    assert len(sampled) == len(draft_token_ids) + 1
    for j, draft in enumerate(draft_token_ids):
        if sampled[j] != draft:
            return sampled[: j + 1]
    return sampled
