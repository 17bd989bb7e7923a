"""StructuredOutputManager on the default model's tokenizer: the bitmask against its
definition (token t allowed iff the matcher would accept it: llguidance's
`validate_tokens`; where the grammar forces the next bytes, only their canonical first
token), EOS only where the grammar accepts, one compile per distinct constraint,
independent matchers per completion."""

import threading

import pytest
import torch
from transformers import PreTrainedTokenizerBase

from pagedllm.sample.ops.token_bitmask import unpack_token_bitmask
from pagedllm.sampling_params import ReasoningTokens, StructuredOutputsParams
from pagedllm.structured_output import GrammarMatcher, StructuredOutputManager
from pagedllm.structured_output import manager as mod

SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "maximum": 9}},
    "required": ["ok", "n"],
    "additionalProperties": False,
}


def allowed_tokens(manager: StructuredOutputManager, matcher: GrammarMatcher) -> list[int]:
    bitmask = manager.grammar_bitmask([matcher])
    vocab_size = manager.ll_tokenizer.vocab_size
    return unpack_token_bitmask(bitmask, vocab_size)[0].nonzero().flatten().tolist()


def accepted_tokens(manager: StructuredOutputManager, matcher: GrammarMatcher) -> list[int]:
    """The definition: each token the matcher would take next (EOS only when accepting);
    the first of the forced tokens when the grammar forces the next bytes."""
    ll = matcher.ll_matcher
    forced = ll.compute_ff_tokens()
    if forced:
        return forced[:1]
    return [t for t in range(manager.ll_tokenizer.vocab_size) if ll.validate_tokens([t]) == 1]


def encode(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def test_bitmask_is_the_set_of_tokens_the_matcher_accepts(
    manager: StructuredOutputManager, tokenizer: PreTrainedTokenizerBase
) -> None:
    (matcher,) = manager.new_matchers(StructuredOutputsParams(json=SCHEMA), 1)
    for token in [None, *encode(tokenizer, '{"ok": true, "n": 7')]:
        if token is not None:
            matcher.accept_token(token)
        assert allowed_tokens(manager, matcher) == accepted_tokens(manager, matcher)
    assert allowed_tokens(manager, matcher) == encode(tokenizer, "}")
    matcher.accept_token(encode(tokenizer, "}")[0])
    assert matcher.is_terminated


def test_eos_only_where_the_grammar_accepts(
    manager: StructuredOutputManager, tokenizer: PreTrainedTokenizerBase
) -> None:
    eos = tokenizer.eos_token_id
    (matcher,) = manager.new_matchers(StructuredOutputsParams(regex="ab+"), 1)
    assert eos not in allowed_tokens(manager, matcher)
    for token in encode(tokenizer, "ab"):
        matcher.accept_token(token)
    assert eos in allowed_tokens(manager, matcher) and not matcher.is_terminated
    matcher.accept_token(eos)
    assert matcher.is_terminated


def test_each_completion_gets_its_own_matcher(
    manager: StructuredOutputManager, tokenizer: PreTrainedTokenizerBase
) -> None:
    first, second = manager.new_matchers(StructuredOutputsParams(choice=["yes", "no"]), 2)
    first.accept_token(encode(tokenizer, "yes")[0])
    assert first.is_terminated and not second.is_terminated
    bitmask = manager.grammar_bitmask([first, second])
    assert not torch.equal(bitmask[0], bitmask[1])


@pytest.mark.parametrize("bit", [5, 31])  # 31: the sign bit of the int32 word
def test_the_token_that_may_open_reasoning_is_allowed_at_the_first_token_only(
    manager: StructuredOutputManager, tokenizer: PreTrainedTokenizerBase, bit: int
) -> None:
    """The grammar's tokens plus the open token; once the answer has a token, the grammar's."""
    start = 32 * 100 + bit
    reasoning = ReasoningTokens([1, 2], in_reasoning=False, start_token_id=start)
    choice = StructuredOutputsParams(choice=["yes", "no"])
    (plain,) = manager.new_matchers(choice, 1)
    first, later = manager.new_matchers(choice, 2, reasoning)
    assert allowed_tokens(manager, first) == sorted([start, *allowed_tokens(manager, plain)])
    for matcher in (later, plain):
        matcher.accept_token(encode(tokenizer, "no")[0])
    assert allowed_tokens(manager, later) == allowed_tokens(manager, plain)


def test_each_distinct_constraint_compiles_once(
    manager: StructuredOutputManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    """By grammar text, least recently used out first."""
    compiled = []
    real = mod.LLMatcher
    monkeypatch.setattr(mod, "LLMatcher", lambda *a, **k: compiled.append(a[1]) or real(*a, **k))
    monkeypatch.setattr(manager, "max_cached_grammars", 2)
    a, b, c = (StructuredOutputsParams(regex=r) for r in ("x+", "y+", "z+"))
    for params in (a, a, b, StructuredOutputsParams(regex="x+"), c, a, b):
        manager.new_matchers(params, 1)
    assert compiled == [mod.grammar_text(p) for p in (a, b, c, b)]  # c evicts b


def test_errors_name_the_constraint(manager: StructuredOutputManager) -> None:
    with pytest.raises(ValueError, match="^structured_outputs has an unsupported or invalid regex"):
        manager.new_matchers(StructuredOutputsParams(regex="(a"), 1)
    without = StructuredOutputManager(None, [])
    with pytest.raises(ValueError, match="structured_outputs need a tokenizer"):
        without.new_matchers(StructuredOutputsParams(regex="a"), 1)


def test_submit_checks_now_and_compiles_on_its_thread(
    manager: StructuredOutputManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bad constraint (or no tokenizer) fails the submit itself; a good one compiles on
    the manager's compile thread, not the caller's, into the same matchers."""
    with pytest.raises(ValueError, match="^structured_outputs has an unsupported or invalid regex"):
        manager.submit(StructuredOutputsParams(regex="(a"), 1)
    with pytest.raises(ValueError, match="structured_outputs need a tokenizer"):
        StructuredOutputManager(None, []).submit(StructuredOutputsParams(regex="a"), 1)
    threads = []
    real = mod.LLMatcher

    def compile_on(*args: object, **kwargs: object) -> object:
        threads.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(mod, "LLMatcher", compile_on)
    params = StructuredOutputsParams(regex="ab+")
    first, second = manager.submit(params, 2).result(timeout=60)
    assert threads == ["pagedllm-grammar_0"]
    (direct,) = manager.new_matchers(params, 1)
    assert allowed_tokens(manager, first) == allowed_tokens(manager, direct)
    first.accept_token(allowed_tokens(manager, first)[0])
    assert allowed_tokens(manager, second) == allowed_tokens(manager, direct)
