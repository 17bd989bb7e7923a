"""GrammarMatcher: a completion's grammar state follows the tokens it accepts (llguidance's
LLMatcher), refuses a token outside its grammar, says when only EOS may follow, and with
ReasoningTokens starts only after the reasoning part (vLLM's reasoning-aware structured
outputs)."""

import pytest
from transformers import PreTrainedTokenizerBase

from pagedllm.sampling_params import ReasoningTokens, StructuredOutputsParams
from pagedllm.structured_output import StructuredOutputManager


def encode(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def test_a_refused_token_is_an_error(
    manager: StructuredOutputManager, tokenizer: PreTrainedTokenizerBase
) -> None:
    (matcher,) = manager.new_matchers(StructuredOutputsParams(choice=["yes", "no"]), 1)
    with pytest.raises(ValueError, match="does not match the structured output constraint"):
        matcher.accept_token(encode(tokenizer, "maybe")[0])


def test_terminated_once_the_grammar_has_nothing_but_eos_left(
    manager: StructuredOutputManager, tokenizer: PreTrainedTokenizerBase
) -> None:
    (matcher,) = manager.new_matchers(StructuredOutputsParams(regex="ab?"), 1)
    matcher.accept_token(encode(tokenizer, "a")[0])
    assert not matcher.is_terminated  # "b" or EOS may follow
    matcher.accept_token(encode(tokenizer, "b")[0])
    assert matcher.is_terminated


def test_after_reasoning_the_grammar_starts_once_the_output_holds_the_end_ids(
    manager: StructuredOutputManager, tokenizer: PreTrainedTokenizerBase
) -> None:
    """vLLM's reasoning-aware structured outputs: tokens the grammar refuses pass freely
    (no advance) until the output holds the end ids (here `</think>` in several tokens,
    its pieces seen apart first), then the grammar applies from its start."""
    end = encode(tokenizer, "</think>")
    assert len(end) > 1
    reasoning = ReasoningTokens(end, in_reasoning=True)
    (matcher,) = manager.new_matchers(StructuredOutputsParams(choice=["yes", "no"]), 1, reasoning)
    for token in [*encode(tokenizer, "maybe"), *end[:-1], *encode(tokenizer, " then"), *end]:
        assert not matcher.is_active and not matcher.is_terminated
        matcher.accept_token(token)
    assert matcher.is_active
    assert matcher.ll_matcher.validate_tokens(encode(tokenizer, "maybe")[:1]) == 0  # refused
    matcher.accept_token(encode(tokenizer, "yes")[0])
    assert matcher.is_terminated


def test_an_answer_may_open_reasoning_with_its_first_token(
    manager: StructuredOutputManager, tokenizer: PreTrainedTokenizerBase
) -> None:
    """The qwen3 case: the open token (any id; here one the grammar refuses) as the first
    token starts a reasoning part; any other first token is the grammar's."""
    start, end = encode(tokenizer, "maybe")[0], encode(tokenizer, "</think>")
    reasoning = ReasoningTokens(end, in_reasoning=False, start_token_id=start)
    choice = StructuredOutputsParams(choice=["yes", "no"])
    opened, direct = manager.new_matchers(choice, 2, reasoning)
    assert opened.is_active and opened.open_token_id == start
    opened.accept_token(start)
    assert not opened.is_active and opened.open_token_id is None
    for token in end:
        opened.accept_token(token)
    assert opened.is_active and not opened.is_terminated
    direct.accept_token(encode(tokenizer, "yes")[0])
    assert direct.open_token_id is None and direct.is_terminated


def accepts(matcher: object, tokenizer: PreTrainedTokenizerBase, text: str) -> bool:
    try:
        for token in encode(tokenizer, text):
            matcher.accept_token(token)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize(
    ("schema", "text", "accepted"),
    [
        ({"type": "object", "properties": {"a": {"type": "integer"}}}, '{"a": 1, "b"', False),
        ({"type": "object", "properties": {"a": {"type": "integer"}}}, '{"a": 1}', True),
        (
            {
                "type": "object",
                "properties": {"a": {"type": "integer"}},
                "additionalProperties": True,
            },
            '{"a": 1, "b": 2}',
            True,
        ),
    ],
)
def test_objects_take_only_their_declared_keys_unless_the_schema_allows_more(
    manager: StructuredOutputManager,
    tokenizer: PreTrainedTokenizerBase,
    schema: dict,
    text: str,
    accepted: bool,
) -> None:
    """As vLLM's default backend (xgrammar) reads a schema that does not say."""
    (matcher,) = manager.new_matchers(StructuredOutputsParams(json=schema), 1)
    assert accepts(matcher, tokenizer, text) is accepted
