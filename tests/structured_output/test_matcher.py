"""GrammarMatcher: a completion's grammar state follows the tokens it accepts (llguidance's
LLMatcher), refuses a token outside its grammar and says when only EOS may follow."""

import pytest
from transformers import PreTrainedTokenizerBase

from pagedllm.sampling_params import StructuredOutputsParams
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
