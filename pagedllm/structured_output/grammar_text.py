"""StructuredOutputsParams -> llguidance's grammar text: the cache key of a compiled
grammar, and what a constraint is checked on before any tokenizer exists."""

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
        schema = {"type": "object"} if kind == "json_object" else params.json
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
