"""pagedllm/entrypoints/openai/tool_format.py and the server's choice of format
(api_server.tool_call_parser_of). References: the tool-call formats of Hermes 2 Pro /
Qwen2.5 / Qwen3 (`<tool_call>`), Llama 3.1 (`<|python_tag|>`) and 3.2 (its JSON
instruction), Mistral (`[TOOL_CALLS]`), as their chat templates write them (abridged
below), and llama.cpp's fallback to a generic format for a template with none."""

import pytest
import transformers
from tokenizers import Tokenizer, models

from pagedllm.entrypoints.openai import api_server
from pagedllm.entrypoints.openai.tool_format import detect_tool_call_parser

HERMES = (
    "{%- if tools %}<|im_start|>system\n# Tools\n<tools>{% for tool in tools %}{{ tool | tojson }}"
    "{% endfor %}</tools>\nFor each function call, return a json object with function name "
    "and arguments within <tool_call></tool_call> XML tags{% endif %}"
)
QWEN3 = (
    "{%- if tools %}<tools>{{ tools | tojson }}</tools>{% endif %}{% for m in messages %}"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>\n{{ c.function | tojson }}"
    "\n</tool_call>{% endfor %}{% endif %}{% if m.reasoning_content %}<think>\n"
    "{{ m.reasoning_content }}\n</think>{% endif %}{% endfor %}"
)
LLAMA31 = (
    "{%- if tools %}Environment: ipython\n{% endif %}{% for m in messages %}"
    "{%- if m.tool_calls %}<|python_tag|>{{ m.tool_calls[0].function | tojson }}{% endif %}"
    "{% endfor %}"
)
LLAMA32 = (
    "{%- if tools %}Given the following functions, please respond with a JSON for a function "
    "call with its proper arguments that best answers the given prompt.\n\nRespond in the "
    'format {"name": function name, "parameters": dictionary of argument name and its '
    "value}. Do not use variables.{% endif %}"
)
MISTRAL = (
    "{%- if tools %}[AVAILABLE_TOOLS] {{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}"
    "{% for m in messages %}{% if m.tool_calls %}[TOOL_CALLS] {{ m.tool_calls | tojson }}"
    "{% endif %}{% endfor %}"
)
SMOLLM2 = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
)


@pytest.mark.parametrize(
    ("template", "parser"),
    [
        (HERMES, "hermes"),
        (QWEN3, "hermes"),
        (LLAMA31, "llama3_json"),
        (LLAMA32, "llama3_json"),
        (MISTRAL, "mistral"),
        (SMOLLM2, "generic"),
        (None, "generic"),
    ],
)
def test_the_template_names_its_format(template: str | None, parser: str) -> None:
    assert detect_tool_call_parser(template) == parser


def tokenizer_with(template: str | dict | None) -> transformers.PreTrainedTokenizerBase:
    backend = Tokenizer(models.WordLevel({"a": 0}, unk_token="a"))
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=backend)
    tokenizer.chat_template = template
    return tokenizer


def test_the_server_reads_the_template_requests_with_tools_use() -> None:
    """--tool-call-parser wins; else the --chat-template, else the tokenizer's template
    (its "tool_use" one when it has named ones); no template at all is generic."""
    tokenizer = tokenizer_with(SMOLLM2)
    assert api_server.tool_call_parser_of(tokenizer, None, None) == "generic"
    assert api_server.tool_call_parser_of(tokenizer, HERMES, None) == "hermes"
    assert api_server.tool_call_parser_of(tokenizer, HERMES, "mistral") == "mistral"
    named = tokenizer_with({"default": SMOLLM2, "tool_use": LLAMA31})
    assert api_server.tool_call_parser_of(named, None, None) == "llama3_json"
    assert api_server.tool_call_parser_of(tokenizer_with(None), None, None) == "generic"
