"""GrammarMatcher: where one completion stands in its grammar."""

from llguidance import LLMatcher


class GrammarMatcher:
    """One completion's state in its constraint: advanced by each token it samples, so it
    follows the output tokens (a preempted sequence keeps its outputs, and so its state).
    `ll_matcher` is what the manager fills the step's bitmask from."""

    def __init__(self, ll_matcher: LLMatcher) -> None:
        self.ll_matcher = ll_matcher

    def accept_token(self, token: int) -> None:
        """Advance by the sampled `token`; the bitmask only lets allowed tokens through, so
        a refusal is a broken invariant, raised as the request's error."""
        if not self.ll_matcher.consume_token(token):
            raise ValueError(
                f"token {token} does not match the structured output constraint: "
                f"{self.ll_matcher.get_error()}"
            )

    @property
    def is_terminated(self) -> bool:
        """The constraint is complete: no token but EOS could follow."""
        return self.ll_matcher.is_stopped()
