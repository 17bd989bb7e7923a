"""StructuredOutputsParams -> llguidance's grammar text: the cache key of a compiled
grammar, and what a constraint is checked on before any tokenizer exists."""

import json

from llguidance import LLMatcher, grammar_from

from pagedllm.sampling_params import StructuredOutputsParams

# JSON as json.dumps writes it: one space after ',' and ':', none elsewhere. llguidance's
# default (any whitespace anywhere) lets a small model spin on newlines until max_tokens.
_COMPACT_JSON = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

_WHAT = {
    "json": "JSON schema",
    "json_object": "JSON schema",
    "regex": "regex",
    "choice": "choice",
    "grammar": "grammar (Lark or GBNF)",
}


def grammar_text(params: StructuredOutputsParams, name: str = "structured_outputs") -> str:
    """The llguidance grammar of `params`' constraint; ValueError naming `name` when a
    GBNF grammar cannot be converted to Lark."""
    kind = params.kind
    if kind in ("json", "json_object"):
        schema = params.json
        schema = json.loads(schema) if isinstance(schema, str) else schema  # checked JSON
        schema = {"type": "object"} if kind == "json_object" else closed_objects(schema)
        options = _COMPACT_JSON
        if params.whitespace_pattern is not None:
            options = {"whitespace_pattern": params.whitespace_pattern}
        return LLMatcher.grammar_from_json_schema(schema, defaults=options)
    if kind == "regex":
        return LLMatcher.grammar_from_regex(params.regex)
    if kind == "choice":
        return grammar_from("choice", params.choice)
    try:
        return grammar_from("grammar", params.grammar)
    except ValueError as e:
        raise invalid_grammar(name, kind, str(e)) from None


# Keywords whose value is a schema, a list of schemas, or a map of names to schemas.
_SUBSCHEMA = ("items", "additionalItems", "contains", "not", "if", "then", "else")
_SUBSCHEMA += ("propertyNames", "unevaluatedItems", "additionalProperties")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


_COMPOSED = ("allOf", "anyOf", "oneOf", "$ref")


def closed_objects(schema: object, part_of_all: bool = False) -> object:
    """`schema` with `"additionalProperties": false` on every object schema that lists its
    `properties` and does not say, as vLLM's default backend (xgrammar) reads a schema:
    pydantic's and most hand-written schemas say nothing, and JSON Schema's default (any
    extra key) lets a model add keys the caller never declared. A schema that sets it keeps
    its value; one that composes its keys (allOf, anyOf, oneOf, $ref beside them) or is a
    part of an allOf (its keys join the other parts') stays as it is, and so does an object
    without `properties` (any object)."""
    if not isinstance(schema, dict):
        return schema
    closed = dict(schema)
    composed = part_of_all or any(key in schema for key in _COMPOSED)
    if "properties" in schema and "additionalProperties" not in schema and not composed:
        closed["additionalProperties"] = False
    for key, value in schema.items():
        if key in _SUBSCHEMA:
            closed[key] = (
                [closed_objects(v) for v in value]
                if isinstance(value, list)
                else closed_objects(value)
            )
        elif key in _SUBSCHEMA_LISTS and isinstance(value, list):
            closed[key] = [closed_objects(v, key == "allOf") for v in value]
        elif key in _SUBSCHEMA_MAPS and isinstance(value, dict):
            closed[key] = {name: closed_objects(v) for name, v in value.items()}
    return closed


def check_grammar(params: StructuredOutputsParams, name: str = "structured_outputs") -> str:
    """The grammar text, checked without a tokenizer (under a millisecond for typical
    schemas): ValueError naming `name` and what is wrong with the schema, regex or grammar."""
    text = grammar_text(params, name)
    is_error, messages = LLMatcher.validate_grammar_with_warnings(text)
    if is_error:
        raise invalid_grammar(name, params.kind, messages[0])
    return text


def invalid_grammar(name: str, kind: str, detail: str) -> ValueError:
    return ValueError(f"{name} has an unsupported or invalid {_WHAT[kind]}: {detail.strip()}")
