"""/tokenize and /detokenize (pagedllm/entrypoints/openai/serving_tokenization.py, vLLM's
extras). Reference: the default model's tokenizer called directly (encode, decode,
apply_chat_template) and the chat endpoint's own prompt for the same messages and tools
(OpenAIServingChat.prepare_chat, and a chat completion's prompt_tokens), in process over a
fake engine and through the running server."""

import asyncio
from collections.abc import Iterator
from types import SimpleNamespace

import httpx
import pytest
from transformers import PreTrainedTokenizerBase

from pagedllm import LLM
from pagedllm.config import CacheConfig, ModelConfig
from pagedllm.engine.stats import EngineStats
from pagedllm.engine.tokenizer import get_tokenizer
from pagedllm.entrypoints.openai.async_tokenizer import AsyncTokenizer
from pagedllm.entrypoints.openai.errors import OpenAIError
from pagedllm.entrypoints.openai.generic_tools import tools_system_prompt
from pagedllm.entrypoints.openai.metrics import ServerMetrics
from pagedllm.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from pagedllm.entrypoints.openai.serving_chat import OpenAIServingChat
from pagedllm.entrypoints.openai.serving_models import OpenAIServingModels
from pagedllm.entrypoints.openai.serving_tokenization import OpenAIServingTokenization
from pagedllm.entrypoints.openai.tool_parsers import TOOL_PARSERS
from tests.entrypoints.openai.remote_server import MAX_MODEL_LEN, MODEL_NAME, Server

TEXT = "Hello, paged attention!"
MESSAGES = [{"role": "user", "content": TEXT}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerBase:
    return get_tokenizer(ModelConfig.create(None, "auto", None, "cpu"))


@pytest.fixture(scope="module")
def shared(tokenizer: PreTrainedTokenizerBase) -> Iterator[tuple]:
    """OpenAIServing's arguments over a fake engine."""
    model_config = SimpleNamespace(
        max_model_len=MAX_MODEL_LEN,
        vocab_size=len(tokenizer),
        runner_type="generate",
        sampling_defaults={},
        max_tokens_cap=None,
    )
    scheduler_config = SimpleNamespace(policy="fcfs")
    config = SimpleNamespace(model_config=model_config, scheduler_config=scheduler_config)
    engine = SimpleNamespace(config=config)
    stats = EngineStats(0, 0, 0, 0.0, 1, 1, 0, 0, 0, 0)
    async_tokenizer = AsyncTokenizer(tokenizer, num_threads=1)
    metrics = ServerMetrics(lambda: [stats], "m", MAX_MODEL_LEN, CacheConfig())
    yield engine, async_tokenizer, OpenAIServingModels(engine, ["m"]), metrics
    async_tokenizer.shutdown()


@pytest.fixture(scope="module")
def serving(shared: tuple) -> OpenAIServingTokenization:
    return OpenAIServingTokenization(*shared)


def tokenize(serving: OpenAIServingTokenization, **body: object) -> list[int]:
    response = asyncio.run(serving.tokenize(TokenizeRequest(**body)))
    assert response.count == len(response.tokens)
    assert response.max_model_len == MAX_MODEL_LEN
    return response.tokens


@pytest.mark.parametrize("add_special_tokens", [True, False])
def test_tokenize_prompt_is_the_tokenizers_encode(
    serving: OpenAIServingTokenization, tokenizer: PreTrainedTokenizerBase, add_special_tokens: bool
) -> None:
    tokens = tokenize(serving, prompt=TEXT, add_special_tokens=add_special_tokens)
    assert tokens == tokenizer.encode(TEXT, add_special_tokens=add_special_tokens)


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_tokenize_messages_is_the_chat_template(
    serving: OpenAIServingTokenization,
    tokenizer: PreTrainedTokenizerBase,
    add_generation_prompt: bool,
) -> None:
    tokens = tokenize(serving, messages=MESSAGES, add_generation_prompt=add_generation_prompt)
    expected = tokenizer.apply_chat_template(
        MESSAGES, add_generation_prompt=add_generation_prompt, return_dict=False
    )
    assert tokens == list(expected)


def test_tokenize_returns_token_strs_when_asked(
    serving: OpenAIServingTokenization, tokenizer: PreTrainedTokenizerBase
) -> None:
    response = asyncio.run(serving.tokenize(TokenizeRequest(prompt=TEXT, return_token_strs=True)))
    assert response.token_strs == tokenizer.convert_ids_to_tokens(response.tokens)
    plain = asyncio.run(serving.tokenize(TokenizeRequest(prompt=TEXT)))
    assert plain.token_strs is None


def test_tokenize_messages_with_special_tokens_adds_them_on_the_template(
    serving: OpenAIServingTokenization, tokenizer: PreTrainedTokenizerBase
) -> None:
    """vLLM's rule: `add_special_tokens` with messages encodes the rendered text with the
    tokenizer's special tokens."""
    tokens = tokenize(serving, messages=MESSAGES, add_special_tokens=True)
    text = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert tokens == tokenizer.encode(text, add_special_tokens=True)


@pytest.mark.parametrize(
    "body", [{}, {"prompt": "a", "messages": MESSAGES}], ids=["neither", "both"]
)
def test_tokenize_needs_exactly_one_of_prompt_and_messages(
    serving: OpenAIServingTokenization, body: dict
) -> None:
    with pytest.raises(OpenAIError) as info:
        tokenize(serving, **body)
    assert (info.value.status_code, info.value.param) == (400, "prompt")


def test_detokenize_is_the_tokenizers_decode(
    serving: OpenAIServingTokenization, tokenizer: PreTrainedTokenizerBase
) -> None:
    ids = tokenizer.encode(TEXT)
    response = asyncio.run(serving.detokenize(DetokenizeRequest(tokens=ids)))
    assert response.prompt == tokenizer.decode(ids) == TEXT


def test_detokenize_refuses_ids_outside_the_vocabulary(
    serving: OpenAIServingTokenization, tokenizer: PreTrainedTokenizerBase
) -> None:
    with pytest.raises(OpenAIError) as info:
        asyncio.run(serving.detokenize(DetokenizeRequest(tokens=[1, len(tokenizer)])))
    assert (info.value.status_code, info.value.param) == (400, "tokens")


def test_unknown_model_is_404_on_both_routes(serving: OpenAIServingTokenization) -> None:
    for call in (
        serving.tokenize(TokenizeRequest(model="gpt-9", prompt="a")),
        serving.detokenize(DetokenizeRequest(model="gpt-9", tokens=[1])),
    ):
        with pytest.raises(OpenAIError) as info:
            asyncio.run(call)
        assert info.value.status_code == 404


def test_tokenize_detokenize_round_trip(server: Server, offline_llm: LLM) -> None:
    """Through the running server's routes."""
    tokenizer = offline_llm.get_tokenizer()
    text = "Hello, paged attention!"
    tokens = httpx.post(server.url + "/tokenize", json={"prompt": text}).json()
    assert tokens["tokens"] == tokenizer.encode(text)
    assert tokens["count"] == len(tokens["tokens"]) and tokens["max_model_len"] == MAX_MODEL_LEN
    messages = [{"role": "user", "content": text}]
    chat = httpx.post(server.url + "/tokenize", json={"messages": messages}).json()
    assert chat["tokens"] == list(
        tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    )
    back = httpx.post(server.url + "/detokenize", json={"tokens": tokens["tokens"]}).json()
    assert back["prompt"] == text


@pytest.mark.parametrize("parser", ["generic", "hermes"])
@pytest.mark.parametrize("tool_choice", [None, "auto", "none", "required"])
def test_tokenize_with_tools_is_the_chat_endpoints_prompt(
    shared: tuple, tokenizer: PreTrainedTokenizerBase, parser: str, tool_choice: str | None
) -> None:
    """The same messages, tools and tool_choice give /tokenize the prompt the chat endpoint
    renders; the generic format's system prompt is in it exactly where that format reads
    the answer (tool choice "auto", the default with tools, on a generic server)."""
    tool_parser = TOOL_PARSERS[parser]
    body = {"messages": MESSAGES, "tools": [WEATHER], "tool_choice": tool_choice}
    tokens = tokenize(OpenAIServingTokenization(*shared, tool_parser=tool_parser), **body)
    chat = OpenAIServingChat(*shared, tool_parser=tool_parser)
    run = asyncio.run(chat.prepare_chat(ChatCompletionRequest(**body)))
    assert tokens == run.prompt_token_ids
    generic = parser == "generic" and tool_choice in (None, "auto")
    system = tools_system_prompt(ChatCompletionRequest(**body).tools)
    assert (system in tokenizer.decode(tokens)) == generic
    if not generic:  # the template's own rendering of the tools
        expected = tokenizer.apply_chat_template(
            MESSAGES, tools=[WEATHER], add_generation_prompt=True, return_dict=False
        )
        assert tokens == list(expected)


# Gemma-2's rule: a template that raises on a system message.
NO_SYSTEM_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}<assistant>"
)


def test_generic_tools_on_a_template_that_refuses_a_system_message(shared: tuple) -> None:
    """The generic format's prompt goes before the first user message's text there (as
    llama.cpp folds a system message); a system message of the user's own is still the
    template's 400, with the template's words."""
    serving = OpenAIServingTokenization(*shared, NO_SYSTEM_TEMPLATE)
    body = {"messages": MESSAGES, "tools": [WEATHER]}
    run = asyncio.run(
        OpenAIServingChat(*shared, NO_SYSTEM_TEMPLATE).prepare_chat(ChatCompletionRequest(**body))
    )
    system = tools_system_prompt(ChatCompletionRequest(**body).tools)
    assert run.prompt_text == f"<user>{system}\n\n{TEXT}\n<assistant>"
    assert tokenize(serving, **body) == run.prompt_token_ids
    with_system = [{"role": "system", "content": "Be brief."}, *MESSAGES]
    with pytest.raises(OpenAIError) as info:
        tokenize(serving, messages=with_system, tools=[WEATHER])
    assert "System role not supported" in info.value.message


def test_tokenize_with_tools_counts_the_chat_completions_prompt_tokens(server: Server) -> None:
    """Through the running server (its default model: the generic format)."""
    body = {"messages": MESSAGES, "tools": [WEATHER]}
    count = httpx.post(server.url + "/tokenize", json=body).json()["count"]
    chat = {**body, "model": MODEL_NAME, "max_tokens": 1, "temperature": 0}
    usage = httpx.post(server.url + "/v1/chat/completions", json=chat).json()["usage"]
    assert count == usage["prompt_tokens"]
    plain = httpx.post(server.url + "/tokenize", json={"messages": MESSAGES}).json()["count"]
    assert count > plain + 20  # the tools' system prompt
