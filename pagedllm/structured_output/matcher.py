"""GrammarMatcher: where one completion stands in its grammar, and whether its reasoning
part (which the grammar does not constrain) has ended."""

from llguidance import LLMatcher

from pagedllm.sampling_params import ReasoningTokens


class GrammarMatcher:
    """One completion's state in its constraint: advanced by each token it samples, so it
    follows the output tokens (a preempted sequence keeps its outputs, and so its state).
    `ll_matcher` is what the manager fills the step's bitmask from.

    With `reasoning` the constraint starts after the answer's reasoning part: until the
    output holds its end ids the completion is free (`is_active` False: no bitmask, the
    grammar does not advance), as vLLM's structured output manager does with a reasoner.
    """

    def __init__(self, ll_matcher: LLMatcher, reasoning: ReasoningTokens | None = None) -> None:
        self.ll_matcher = ll_matcher
        self.end_token_ids = reasoning.end_token_ids if reasoning else []
        self.in_reasoning = reasoning is not None and reasoning.in_reasoning
        # The token that may open a reasoning part, allowed only as the first token.
        self.open_token_id = None if reasoning is None else reasoning.start_token_id
        self._recent: list[int] = []  # the last len(end_token_ids) tokens of the reasoning

    @property
    def is_active(self) -> bool:
        """The grammar constrains the next token (the reasoning part, if any, has ended)."""
        return not self.in_reasoning

    def accept_token(self, token: int) -> None:
        """Advance by the sampled `token`; the bitmask only lets allowed tokens through, so
        a refusal is a broken invariant, raised as the request's error."""
        opens, self.open_token_id = token == self.open_token_id, None
        if opens:
            self.in_reasoning = True
        elif self.in_reasoning:
            self._recent = (self._recent + [token])[-len(self.end_token_ids) :]
            self.in_reasoning = self._recent != self.end_token_ids
        elif not self.ll_matcher.consume_token(token):
            raise ValueError(
                f"token {token} does not match the structured output constraint: "
                f"{self.ll_matcher.get_error()}"
            )

    @property
    def is_terminated(self) -> bool:
        """The constraint is complete: no token but EOS could follow."""
        return self.is_active and self.ll_matcher.is_stopped()
