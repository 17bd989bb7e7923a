"""Constraints -> llguidance grammars, checked without a tokenizer: llguidance's own
messages, prefixed with the field that holds the constraint."""

import pytest

from pagedllm.sampling_params import StructuredOutputsParams
from pagedllm.structured_output import check_grammar, grammar_text
from pagedllm.structured_output.grammar_text import closed_objects


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


def test_closed_objects_marks_every_object_that_does_not_say() -> None:
    """Object schemas at any depth ($defs, items, anyOf) get additionalProperties false; a
    property map is a map of names (a property named "properties" is not a schema)."""
    item = {"type": "object", "properties": {"x": {"type": "integer"}}}
    schema = {
        "type": "object",
        "properties": {
            "properties": {"type": "string"},
            "list": {"type": "array", "items": {"$ref": "#/$defs/Item"}},
            "either": {"anyOf": [item, {"type": "null"}]},
            "open": {"type": "object", "additionalProperties": True},
        },
        "$defs": {"Item": item},
    }
    closed = closed_objects(schema)
    assert closed["additionalProperties"] is False
    assert closed["properties"]["properties"] == {"type": "string"}
    assert closed["$defs"]["Item"]["additionalProperties"] is False
    assert closed["properties"]["either"]["anyOf"][0]["additionalProperties"] is False
    assert closed["properties"]["either"]["anyOf"][1] == {"type": "null"}
    assert closed["properties"]["open"]["additionalProperties"] is True
    assert "additionalProperties" not in schema, "the caller's schema is left as it was"


def test_objects_that_compose_their_keys_stay_open() -> None:
    """allOf parts join their keys, an anyOf holder takes its branches' keys, and an object
    without properties is any object: closing them would refuse what they declare (a tool
    call schema's `{"type": "object", "anyOf": [...calls]}` items among them)."""
    call = {"properties": {"name": {"const": "f"}}, "required": ["name"]}
    schema = {
        "type": "object",
        "properties": {
            "items": {"type": "object", "anyOf": [call]},
            "merged": {"allOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]},
            "free": {"type": "object"},
        },
    }
    closed = closed_objects(schema)["properties"]
    assert "additionalProperties" not in closed["items"]
    assert closed["items"]["anyOf"][0]["additionalProperties"] is False, "a branch is whole"
    assert all("additionalProperties" not in part for part in closed["merged"]["allOf"])
    assert closed["free"] == {"type": "object"}
    check_grammar(StructuredOutputsParams(json=schema))
