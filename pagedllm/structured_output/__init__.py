"""Structured outputs: a request's constraint (JSON schema, regex, choice, Lark/GBNF
grammar) compiled by llguidance into per-completion matchers, whose token bitmask the
sampler applies each step; see manager.py."""

from pagedllm.structured_output.grammar_text import (
    check_grammar,
    grammar_text,
)
from pagedllm.structured_output.manager import StructuredOutputManager
from pagedllm.structured_output.matcher import GrammarMatcher

__all__ = [
    "GrammarMatcher",
    "StructuredOutputManager",
    "check_grammar",
    "grammar_text",
]
