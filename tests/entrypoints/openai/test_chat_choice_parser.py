"""pagedllm/entrypoints/openai/chat_choice_parser.py, alone and through the server. The
reference answers come from a scripted model (scripted_model.py: a tiny Llama whose greedy
answer is a known chain of words that thinks and calls a tool), run by the real engine and
read with the official `openai` client: reasoning and calls split as vLLM's parsers split
them, and a streamed answer accumulates to the non-streamed one."""

import argparse
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Literal

import openai
import pydantic
import pytest
from fastapi.testclient import TestClient

from pagedllm import LLM, SamplingParams
from pagedllm.engine.async_llm import AsyncLLM
from pagedllm.entrypoints.openai import api_server
from pagedllm.entrypoints.openai.chat_choice_parser import ChoiceParser
from pagedllm.entrypoints.openai.reasoning import REASONING_PARSERS
from pagedllm.entrypoints.openai.tool_parsers import TOOL_PARSERS
from tests.entrypoints.openai.scripted_model import (
    ANSWER_CALL,
    ANSWER_GENERIC_REPLY,
    ANSWER_REASONING,
    WEATHER,
    save_scripted_model,
)

MESSAGES = [{"role": "user", "content": "Weather?"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
CALL = '<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>'


def test_reasoning_first_then_calls_in_the_content() -> None:
    parser = ChoiceParser(REASONING_PARSERS["qwen3"](), TOOL_PARSERS["hermes"]())
    parsed = parser.parse(f"<think>why</think>\n\n{CALL}{CALL}")
    assert (parsed.reasoning, parsed.content) == ("why", "")
    assert [(c.index, c.name, c.arguments) for c in parsed.tool_calls] == [
        (0, "f", '{"x": 1}'),
        (1, "f", '{"x": 1}'),
    ]
    assert parser.tools_called
    inside = ChoiceParser(REASONING_PARSERS["qwen3"](), TOOL_PARSERS["hermes"]())
    assert inside.parse(f"<think>{CALL}</think>ok").reasoning == CALL


def test_parallel_tool_calls_false_keeps_the_first_call() -> None:
    parser = ChoiceParser(None, TOOL_PARSERS["hermes"](), parallel_tool_calls=False)
    streamed = [parser.feed(CALL), parser.feed(CALL), parser.finish()]
    assert [c.index for d in streamed for c in d.tool_calls] == [0]


# Through the server: the scripted model behind in-process apps, one per parser setting.


@pytest.fixture(scope="module")
def scripted_llm(tmp_path_factory: pytest.TempPathFactory) -> LLM:
    folder = tmp_path_factory.mktemp("scripted")
    save_scripted_model(str(folder))
    return LLM(model=str(folder), num_kv_blocks=64, max_model_len=256)


@pytest.fixture
def serve(scripted_llm: LLM) -> Callable:
    """serve(**build_app options) -> a context giving (openai client, test client)."""

    @contextmanager
    def start(**options: object) -> Iterator[tuple[openai.OpenAI, TestClient]]:
        app = api_server.build_app(AsyncLLM(scripted_llm.llm_engine), ["scripted"], **options)
        with TestClient(app) as http:
            client = openai.OpenAI(
                base_url="http://testserver/v1", api_key="unused", http_client=http
            )
            yield client, http

    return start


def ask(client: openai.OpenAI, **fields: object) -> openai.types.chat.ChatCompletion:
    return client.chat.completions.create(
        model="scripted", messages=MESSAGES, temperature=0, max_tokens=30, **fields
    )


def test_auto_tool_calls_after_reasoning_streamed_and_whole(serve: Callable) -> None:
    """--tool-call-parser overrides the template's format (the scripted template has none)."""
    options = dict(reasoning_parser="qwen3", tool_call_parser="hermes")
    with serve(**options) as (client, _):
        whole = ask(client, tools=TOOLS)
        with client.chat.completions.stream(
            model="scripted", messages=MESSAGES, temperature=0, max_tokens=30, tools=TOOLS
        ) as stream:
            chunks = list(stream)
            streamed = stream.get_final_completion()
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert choice.message.reasoning_content.strip() == ANSWER_REASONING
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("chatcmpl-tool-")
    assert call.function.model_dump() == ANSWER_CALL
    assert streamed.choices[0].finish_reason == "tool_calls"
    (streamed_call,) = streamed.choices[0].message.tool_calls
    assert (streamed_call.function.name, streamed_call.function.arguments) == tuple(
        ANSWER_CALL.values()
    )
    deltas = [c.chunk.choices[0].delta for c in chunks if c.type == "chunk" and c.chunk.choices]
    reasoning = "".join(d.model_extra.get("reasoning_content") or "" for d in deltas)
    assert reasoning == choice.message.reasoning_content
    # vLLM's way: the name first (with the id), then the arguments in pieces as generated
    # (a chunk holds every token generated since the last one the client read, so under
    # load the name's chunk may carry the first piece).
    first, *rest = [t for d in deltas for t in d.tool_calls or []]
    assert first.function.name == "get_weather" and first.id.startswith("chatcmpl-tool-")
    assert rest and all(t.id is None and t.function.name is None for t in rest)
    pieces = [first.function.arguments] + [t.function.arguments for t in rest]
    assert "".join(pieces) == ANSWER_CALL["arguments"]


def test_reasoning_parsers_and_the_template_options(serve: Callable) -> None:
    with serve(reasoning_parser="qwen3") as (client, _):
        thinking = ask(client).choices[0].message
        plain = ask(client, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        hidden = ask(client, extra_body={"include_reasoning": False}).choices[0].message
    assert thinking.reasoning_content.strip() == ANSWER_REASONING
    assert thinking.content.strip().startswith("<tool_call>")  # no tools asked: content
    assert plain.choices[0].message.reasoning_content is None
    assert plain.choices[0].message.content == thinking.content
    assert hidden.reasoning_content is None and hidden.content == thinking.content
    with serve(reasoning_parser="deepseek_r1") as (client, _):
        opened = ask(client, extra_body={"chat_template_kwargs": {"think_in_prompt": True}})
    assert opened.choices[0].message.reasoning_content.strip() == ANSWER_REASONING
    assert opened.choices[0].message.content == thinking.content


class Weather(pydantic.BaseModel):
    weather: Literal["sunny"]


def test_structured_outputs_apply_after_the_reasoning(serve: Callable) -> None:
    """vLLM's reasoning-aware structured outputs: the reasoning part is the model's own (the
    schema would refuse it), the content after it is the schema's (the scripted model would
    write a tool call there), for the client's `parse` with n=2, a named tool, and a
    stream; a prompt that closed its think part (enable_thinking false) is constrained from
    the first token, and deepseek_r1's answers start inside their reasoning."""
    weather = {"type": "json_schema", "json_schema": {"name": "weather", "schema": WEATHER}}
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
    named = {"type": "function", "function": {"name": "get_weather"}}
    with serve(reasoning_parser="qwen3") as (client, _):
        parsed = client.chat.completions.parse(
            model="scripted",
            messages=MESSAGES,
            temperature=0,
            max_tokens=30,
            n=2,
            response_format=Weather,
        )
        called = ask(client, tools=tools, tool_choice=named).choices[0].message
        chunks = ask(client, response_format=weather, stream=True)
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        closed = {"chat_template_kwargs": {"enable_thinking": False}}
        plain = ask(client, response_format=weather, extra_body=closed).choices[0].message
    with serve(reasoning_parser="deepseek_r1") as (client, _):
        opened = {"chat_template_kwargs": {"think_in_prompt": True}}
        r1 = ask(client, response_format=weather, extra_body=opened).choices[0].message
    for choice in parsed.choices:
        assert choice.message.parsed == Weather(weather="sunny")
        assert choice.message.reasoning_content.strip() == ANSWER_REASONING
        assert choice.finish_reason == "stop"
    (call,) = called.tool_calls
    assert json.loads(call.function.arguments) == {"weather": "sunny"}
    assert called.reasoning_content.strip() == ANSWER_REASONING and called.content is None
    streamed_reasoning = "".join(d.model_extra.get("reasoning_content") or "" for d in deltas)
    assert streamed_reasoning.strip() == ANSWER_REASONING
    assert json.loads("".join(d.content or "" for d in deltas)) == {"weather": "sunny"}
    assert plain.reasoning_content is None and json.loads(plain.content) == {"weather": "sunny"}
    assert r1.reasoning_content.strip() == ANSWER_REASONING
    assert json.loads(r1.content) == {"weather": "sunny"}


def test_tool_round_trip_renders_calls_and_results(serve: Callable, scripted_llm: LLM) -> None:
    """The assistant's call and the tool's result reach the template (the scripted model
    answers "It is sunny" after a tool result)."""
    options = dict(reasoning_parser="qwen3", tool_call_parser="hermes")
    with serve(**options) as (client, http):
        call = ask(client, tools=TOOLS).choices[0].message.tool_calls[0]
        messages = [
            *MESSAGES,
            {"role": "assistant", "tool_calls": [call.model_dump() | {"id": "call_1"}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ]
        answer = client.chat.completions.create(
            model="scripted", messages=messages, tools=TOOLS, temperature=0, max_tokens=30
        )
        body = {"messages": messages, "tools": TOOLS}
        tokens = http.post("/tokenize", json=body).json()["tokens"]
    assert answer.choices[0].message.content.strip() == "It is sunny"
    assert (
        answer.choices[0].finish_reason == "stop" and answer.choices[0].message.tool_calls is None
    )
    prompt = (
        "user Weather? assistant call get_weather Paris tool call_1 sunny tools get_weather answer"
    )
    assert tokens == scripted_llm.get_tokenizer().encode(prompt)
    assert scripted_llm.get_tokenizer().unk_token_id not in tokens
    assert json.loads(call.function.arguments) == {"city": "Paris"}


def test_auto_without_flags_is_the_generic_format_and_named_tools_must_exist(
    serve: Callable,
) -> None:
    """The scripted template has no tool format: "auto" constrains the answer to a reply
    or the generic calls (the words allow one reply, read as content); "none" leaves it
    alone."""
    with serve() as (client, _):
        auto = ask(client, tools=TOOLS).choices[0].message
        assert auto.tool_calls is None
        assert auto.content == json.loads(ANSWER_GENERIC_REPLY)["response"]
        named = {"type": "function", "function": {"name": "get_time"}}
        with pytest.raises(openai.BadRequestError, match="'get_time', which is not one"):
            ask(client, tools=TOOLS, tool_choice=named)
        none = ask(client, tools=TOOLS, tool_choice="none").choices[0].message
        assert none.tool_calls is None and "<tool_call>" in none.content


def test_the_tool_flags_as_vllm_takes_them() -> None:
    """--enable-auto-tool-choice is accepted alone (a no-op) or with --tool-call-parser."""
    parser = api_server.make_arg_parser(argparse.ArgumentParser())
    alone = parser.parse_args(["--enable-auto-tool-choice"])
    assert (alone.enable_auto_tool_choice, alone.tool_call_parser) == (True, None)
    flags = ["--enable-auto-tool-choice", "--tool-call-parser", "mistral"]
    args = parser.parse_args([*flags, "--reasoning-parser", "deepseek_r1"])
    assert (args.enable_auto_tool_choice, args.tool_call_parser) == (True, "mistral")
    assert args.reasoning_parser == "deepseek_r1"
    flag, name = "--tool-call-parser", "pythonic"
    expected = r"'pythonic' is not one of \['generic', 'hermes', 'llama3_json', 'mistral'\]"
    with pytest.raises(ValueError, match=expected):
        api_server.registered(flag, name, TOOL_PARSERS)
    with pytest.raises(ValueError, match=r"'r2' is not one of \['deepseek_r1', 'qwen3'\]"):
        api_server.registered("--reasoning-parser", "r2", REASONING_PARSERS)


def test_streamed_token_ids_join_to_the_whole_while_parsers_hold_text_back(
    serve: Callable, scripted_llm: LLM
) -> None:
    """vLLM's return_token_ids with a reasoning and a tool parser: a chunk whose text the
    parsers hold back (`<think>`, `</think>`, `<tool_call>`, a call's pieces) is still sent,
    with its ids and an empty delta, so the streamed ids join to the whole answer's: the
    engine's own (LLM.generate of the prompt's ids)."""
    options = dict(reasoning_parser="qwen3", tool_call_parser="hermes")
    fields = {"tools": TOOLS, "extra_body": {"return_token_ids": True}}
    with serve(**options) as (client, http):
        whole = ask(client, **fields)
        body = {"model": "scripted", "messages": MESSAGES, "temperature": 0, "max_tokens": 30}
        body |= {"tools": TOOLS, "return_token_ids": True, "stream": True}
        lines = http.post("/v1/chat/completions", json=body).text.splitlines()
    chunks = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    prompt_ids = whole.model_extra["prompt_token_ids"]
    ids = whole.choices[0].model_extra["token_ids"]
    params = SamplingParams(temperature=0, max_tokens=30)
    (offline,) = scripted_llm.generate({"prompt_token_ids": prompt_ids}, params, use_tqdm=False)
    assert ids == list(offline.outputs[0].token_ids)
    assert chunks[0]["prompt_token_ids"] == prompt_ids
    streamed = [c["choices"][0] for c in chunks]
    assert [t for c in streamed for t in c["token_ids"]] == ids
    said = ("content", "reasoning_content", "tool_calls")
    held = [c for c in streamed if not any(c["delta"].get(k) for k in said)]
    assert any(c["token_ids"] and c["finish_reason"] is None for c in held)
