"""Constraints -> llguidance grammars, checked without a tokenizer: llguidance's own
messages, prefixed with the field that holds the constraint."""

import pytest

from pagedllm.sampling_params import StructuredOutputsParams
from pagedllm.structured_output import check_grammar, grammar_text


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"json": {"type": "object", "properties": {"a": {"type": "strin"}}}}, "JSON schema"),
        ({"json": {"type": "string", "format": "bogus"}}, "JSON schema: Unknown format"),
        ({"json": {"if": {"type": "string"}, "then": {}}}, r'JSON schema: .*\["if", "then"\]'),
        ({"regex": "a(b"}, "regex: .*unclosed group"),
        ({"grammar": "start: missing_rule"}, "grammar .*unknown name"),
        ({"grammar": 'root ::= ("a"'}, "grammar"),
    ],
)
def test_invalid_constraints_name_the_field_and_the_problem(kwargs: dict, message: str) -> None:
    params = StructuredOutputsParams(**kwargs)
    with pytest.raises(
        ValueError, match="(?s)^structured_outputs has an unsupported or invalid " + message
    ):
        check_grammar(params)
    with pytest.raises(ValueError, match="^response_format has an unsupported or invalid"):
        check_grammar(params, "response_format")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"json": {"type": "object", "properties": {"a": {"type": "integer"}}}},
        {"json_object": True},
        {"regex": r"\d{3}-[a-z]+"},
        {"choice": ["yes", "no", 'with "quotes"']},
        {"grammar": 'start: "(" NUM ")"\nNUM: /[0-9]+/'},
        {"grammar": 'root ::= "(" [0-9]+ ")"'},  # llama.cpp's GBNF
    ],
)
def test_valid_constraints_pass(kwargs: dict) -> None:
    params = StructuredOutputsParams(**kwargs)
    assert check_grammar(params) == grammar_text(params)


def test_the_grammar_text_is_the_cache_key_of_a_constraint() -> None:
    """Equal constraints give equal text; JSON options are part of it."""
    schema = {"type": "object"}
    assert grammar_text(StructuredOutputsParams(json=schema)) == grammar_text(
        StructuredOutputsParams(json='{"type": "object"}')
    )
    spaced = StructuredOutputsParams(json=schema, whitespace_pattern=" *")
    assert grammar_text(spaced) != grammar_text(StructuredOutputsParams(json=schema))
