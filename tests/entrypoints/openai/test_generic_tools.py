"""pagedllm/entrypoints/openai/generic_tools.py. References: llama.cpp's generic tool format
(the tools and the answer's JSON shape in a system message) and llguidance run on the
default model's tokenizer: the constraint accepts plain text or calls whose arguments are
valid (jsonschema agrees), and nothing else."""

import json

import jsonschema
import llguidance.hf
import pytest
from llguidance import LLMatcher, grammar_from

from pagedllm.config import default_model_path
from pagedllm.entrypoints.openai.errors import OpenAIError
from pagedllm.entrypoints.openai.generic_tools import (
    ANSWER_SHAPE,
    generic_tools_constraint,
    tools_system_prompt,
    with_tools_system_prompt,
)
from pagedllm.entrypoints.openai.protocol import ChatCompletionRequest
from pagedllm.gguf.tokenizer import load_gguf_tokenizer

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"$ref": "#/$defs/unit"}},
    "required": ["city"],
    "$defs": {"unit": {"enum": ["C", "F"]}},
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "now", "description": "The time."}},
]


def tools(entries: list[dict] = TOOLS) -> list:
    return ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], tools=entries).tools


def test_the_system_prompt_describes_the_tools_and_the_answer() -> None:
    prompt = tools_system_prompt(tools())
    described = [json.loads(line) for line in prompt.splitlines() if line.startswith('{"name')]
    assert described == [
        {"name": "get_weather", "parameters": WEATHER},
        {"name": "now", "description": "The time."},
    ]
    assert ANSWER_SHAPE in prompt
    user = {"role": "user", "content": "hi"}
    assert with_tools_system_prompt([user], "P") == [{"role": "system", "content": "P"}, user]
    system = {"role": "system", "content": "Be terse."}
    merged = with_tools_system_prompt([system, user], "P")
    assert merged == [{"role": "system", "content": "Be terse.\n\nP"}, user]


@pytest.fixture(scope="module")
def accepts() -> object:
    tokenizer = load_gguf_tokenizer(default_model_path())
    ll_tokenizer = llguidance.hf.from_tokenizer(tokenizer)

    def run(grammar: str, text: str) -> bool:
        matcher = LLMatcher(ll_tokenizer, grammar_from("grammar", grammar), log_level=0)
        ids = tokenizer.encode(text)
        return all(matcher.consume_token(i) for i in ids) and matcher.is_accepting()

    return run


CALL = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}'
ANSWERS = [
    ("It is sunny.\n{not json", True),
    (f'{{"tool_calls": [{CALL}, {{"name": "now", "arguments": {{}}}}]}}', True),
    (" It is sunny.", False),  # text starts with neither "{" nor a space
    ('{"tool_calls": []}', False),
    ('{"tool_calls": [{"name": "get_weather", "arguments": {"unit": "C"}}]}', False),
    ('{"tool_calls": [{"name": "get_weather", "arguments": {"city": "P", "unit": "K"}}]}', False),
    ('{"tool_calls": [{"name": "other", "arguments": {}}]}', False),
    ('{"tool_calls": [{"arguments": {}, "name": "now"}]}', False),
]


@pytest.mark.parametrize(("text", "allowed"), ANSWERS)
def test_the_constraint_allows_text_or_valid_calls(
    accepts: object, text: str, allowed: bool
) -> None:
    grammar = generic_tools_constraint(tools(), parallel_tool_calls=True).grammar
    assert accepts(grammar, text) == allowed
    if allowed and text.startswith("{"):
        for call in json.loads(text)["tool_calls"]:
            if call["name"] == "get_weather":
                jsonschema.validate(call["arguments"], WEATHER)


def test_one_call_at_most_without_parallel_tool_calls(accepts: object) -> None:
    grammar = generic_tools_constraint(tools(), parallel_tool_calls=False).grammar
    assert accepts(grammar, f'{{"tool_calls": [{CALL}]}}')
    assert not accepts(grammar, f'{{"tool_calls": [{CALL}, {CALL}]}}')


def test_a_schema_llguidance_refuses_is_a_400_naming_tools() -> None:
    bad = {"type": "function", "function": {"name": "f", "parameters": {"type": "strin"}}}
    with pytest.raises(OpenAIError, match="tools has an unsupported or invalid") as error:
        generic_tools_constraint(tools([bad]), parallel_tool_calls=True)
    assert error.value.param == "tools"
