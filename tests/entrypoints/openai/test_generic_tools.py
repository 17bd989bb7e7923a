"""pagedllm/entrypoints/openai/generic_tools.py. References: llama.cpp's generic tool format
(the tools and the answer's JSON shapes in a system message, calls shown in the
conversation as JSON) and llguidance run on the default model's tokenizer: the constraint
accepts a reply or calls whose arguments are valid (jsonschema agrees), and nothing
else."""

import json

import jsonschema
import llguidance.hf
import pytest
from llguidance import LLMatcher

from pagedllm.config import default_model_path
from pagedllm.entrypoints.openai.errors import OpenAIError
from pagedllm.entrypoints.openai.generic_tools import (
    ANSWER_SHAPE,
    REPLY_SHAPE,
    generic_conversations,
    generic_tools_constraint,
    tools_system_prompt,
    with_tools_system_prompt,
    with_tools_user_prompt,
)
from pagedllm.entrypoints.openai.protocol import ChatCompletionRequest
from pagedllm.gguf.tokenizer import load_gguf_tokenizer
from pagedllm.structured_output import grammar_text

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
    assert ANSWER_SHAPE in prompt and REPLY_SHAPE in prompt
    user = {"role": "user", "content": "hi"}
    assert with_tools_system_prompt([user], "P") == [{"role": "system", "content": "P"}, user]
    system = {"role": "system", "content": "Be terse."}
    merged = with_tools_system_prompt([system, user], "P")
    assert merged == [{"role": "system", "content": "Be terse.\n\nP"}, user]


def test_templates_that_refuse_a_system_message_get_the_prompt_in_the_first_user_turn() -> None:
    """A second form, tried when the template raises on the first: the prompt before the
    first user message's text (llama.cpp folds a system message so); none where the user
    wrote a system message of their own (the template refuses their request either way)."""
    assistant = {"role": "assistant", "content": "Hello."}
    user = {"role": "user", "content": "hi"}
    with_system, in_user = generic_conversations([assistant, user], "P")
    assert with_system[0] == {"role": "system", "content": "P"}
    assert in_user == [assistant, {"role": "user", "content": "P\n\nhi"}]
    assert with_tools_user_prompt([assistant], "P") == [{"role": "user", "content": "P"}, assistant]
    system = {"role": "system", "content": "Be terse."}
    assert len(generic_conversations([system, user], "P")) == 1


def test_the_conversation_shows_calls_in_the_format() -> None:
    """A template with no tool format shows only content: an assistant's calls are written
    into it as the format's JSON, after any text."""
    call = {"id": "c", "type": "function", "function": {"name": "now", "arguments": {"z": "é"}}}
    calls = {"role": "assistant", "content": "", "tool_calls": [call]}
    result = {"role": "tool", "tool_call_id": "c", "content": "noon"}
    (system, shown, tool), _ = generic_conversations([calls, result], "P")
    assert system == {"role": "system", "content": "P"} and tool == result
    expected = {"tool_calls": [{"name": "now", "arguments": {"z": "é"}}]}
    assert json.loads(shown["content"]) == expected
    assert "é" in shown["content"] and shown["tool_calls"] == [call]
    (_, with_text), _ = generic_conversations([{**calls, "content": "Let me see."}], "P")
    assert with_text["content"] == "Let me see.\n\n" + shown["content"]


@pytest.fixture(scope="module")
def accepts() -> object:
    tokenizer = load_gguf_tokenizer(default_model_path())
    ll_tokenizer = llguidance.hf.from_tokenizer(tokenizer)

    def run(grammar: str, text: str) -> bool:
        matcher = LLMatcher(ll_tokenizer, grammar, log_level=0)
        ids = tokenizer.encode(text)
        return all(matcher.consume_token(i) for i in ids) and matcher.is_accepting()

    return run


CALL = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}'
ANSWERS = [
    ('{"response": "It is sunny.\\n{not json"}', True),
    ("It is sunny.", False),  # every answer is one JSON object
    ('{"response": "Hi", "tool_calls": []}', False),
    (f'{{"tool_calls": [{CALL}, {{"name": "now", "arguments": {{}}}}]}}', True),
    ('{"tool_calls": []}', False),
    ('{"tool_calls": [{"name": "get_weather", "arguments": {"unit": "C"}}]}', False),
    ('{"tool_calls": [{"name": "get_weather", "arguments": {"city": "P", "unit": "K"}}]}', False),
    ('{"tool_calls": [{"name": "other", "arguments": {}}]}', False),
    ('{"tool_calls": [{"arguments": {}, "name": "now"}]}', False),
]


@pytest.mark.parametrize(("text", "allowed"), ANSWERS)
def test_the_constraint_allows_a_reply_or_valid_calls(
    accepts: object, text: str, allowed: bool
) -> None:
    grammar = grammar_text(generic_tools_constraint(tools(), parallel_tool_calls=True))
    assert accepts(grammar, text) == allowed
    if allowed:
        for call in json.loads(text).get("tool_calls", []):
            if call["name"] == "get_weather":
                jsonschema.validate(call["arguments"], WEATHER)


def test_one_call_at_most_without_parallel_tool_calls(accepts: object) -> None:
    grammar = grammar_text(generic_tools_constraint(tools(), parallel_tool_calls=False))
    assert accepts(grammar, f'{{"tool_calls": [{CALL}]}}')
    assert not accepts(grammar, f'{{"tool_calls": [{CALL}, {CALL}]}}')


def test_a_schema_llguidance_refuses_is_a_400_naming_tools() -> None:
    bad = {"type": "function", "function": {"name": "f", "parameters": {"type": "strin"}}}
    with pytest.raises(OpenAIError, match="tools has an unsupported or invalid") as error:
        generic_tools_constraint(tools([bad]), parallel_tool_calls=True)
    assert error.value.param == "tools"
