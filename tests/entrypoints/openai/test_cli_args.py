"""entrypoints/openai/cli_args.py: vLLM's serve flags, parsed and applied: --model as the
positional's alternative, --seed as the engine's, a default chat template argument under a
request's own, X-Request-Id echoed, the structured-outputs backend names pagedllm answers
to, --lora-modules' two forms and start-up rules. Reference: vLLM's flag names and
behaviour."""

import argparse
import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from pagedllm import LLM
from pagedllm.config import SpeculativeConfig
from pagedllm.engine.arg_utils import EngineArgs
from pagedllm.engine.async_llm import AsyncLLM
from pagedllm.entrypoints.openai import api_server
from pagedllm.entrypoints.openai.cli_args import serve_model
from pagedllm.entrypoints.openai.serving_models import LoRAModulePath
from tests.entrypoints.openai.scripted_model import save_scripted_model

SPECULATIVE = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    api_server.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["serve", *argv])


def test_vllms_flags_parse() -> None:
    args = parse(
        [
            "--model", "m",
            "--seed", "7",
            "--root-path", "/llm",
            "--default-chat-template-kwargs", '{"enable_thinking": false}',
            "--chat-template-content-format", "string",
            "--enable-request-id-headers",
            "--enable-prompt-tokens-details",
            "--enable-force-include-usage",
            "--return-tokens-as-token-ids",
            "--structured-outputs-config.backend", "guidance",
            "--response-role", "bot",
        ]
    )  # fmt: skip
    assert serve_model(args) == "m" and args.seed == 7 and args.root_path == "/llm"
    assert args.default_chat_template_kwargs == {"enable_thinking": False}
    assert args.enable_force_include_usage and args.return_tokens_as_token_ids
    assert args.response_role == "bot" and parse([]).response_role == "assistant"
    assert parse(["m", "--model", "m"]).model == "m"
    with pytest.raises(ValueError, match="given twice"):
        serve_model(parse(["a", "--model", "b"]))
    for bad in (
        ["--structured-outputs-config.backend", "xgrammar"],
        ["--chat-template-content-format", "openai"],
        ["--default-chat-template-kwargs", "[1]"],
    ):
        with pytest.raises(SystemExit):
            parse(bad)


def test_lora_modules_parse_in_vllms_two_forms() -> None:
    """vLLM's --lora-modules: several values, each `name=path` or a JSON object."""
    law = '{"name": "law", "path": "/a/law", "base_model_name": "m"}'
    args = parse(["--lora-modules", "sql=/a/sql=v2", law, '{"name": "x", "path": "/a/x"}'])
    assert args.lora_modules == [
        LoRAModulePath("sql", "/a/sql=v2"),
        LoRAModulePath("law", "/a/law", "m"),
        LoRAModulePath("x", "/a/x"),
    ]
    assert parse([]).lora_modules == []


@pytest.mark.parametrize(
    "value, message",
    [
        ("sql", "is neither name=path nor a JSON object"),
        ("=/a/sql", "`name` must be a non-empty string"),
        ("sql=", "`path` must be a non-empty string"),
        ('{"name": "sql"}', "must have `name` and `path`"),
        ('{"name": "sql", "path": "/a", "rank": 8}', r"got \['name', 'path', 'rank'\]"),
        ('{"name": 3, "path": "/a"}', "`name` must be a non-empty string"),
        ('["sql", "/a"]', "must be name=path or a JSON object"),
    ],
)
def test_a_bad_lora_module_is_named(
    value: str, message: str, capsys: pytest.CaptureFixture
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse(["--lora-modules", value])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--lora-modules" in err and re.search(message, err), err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--lora-modules", "sql=/a/sql"], r"--lora-modules \['sql'\] needs --enable-lora"),
        (
            ["--enable-lora", "--lora-modules", "sql=/a", "law=/b", "sql=/c"],
            r"names the adapters \['sql'\] more than once",
        ),
        (
            ["--enable-lora", "--served-model-name", "m", "--lora-modules", "m=/a"],
            "the adapter name 'm' is a served model name",
        ),
        (
            [
                "--enable-lora",
                "--lora-modules",
                '{"name": "sql", "path": "/a", "base_model_name": "x"}',
            ],
            "base_model_name 'x' of adapter 'sql' is not a served model name",
        ),
    ],
)
def test_lora_modules_the_server_cannot_serve_stop_it_before_the_model_loads(
    argv: list[str], message: str, capsys: pytest.CaptureFixture
) -> None:
    """As any bad flag: exit 2 with the reason (and no engine built: main would load the
    default model first otherwise, and the check would come too late)."""
    with pytest.raises(SystemExit) as exit_info:
        api_server.main(["--port", "0", *argv])
    assert exit_info.value.code == 2
    assert re.search(message, capsys.readouterr().err)


def test_speculative_config_flag_parses_as_vllms_json() -> None:
    args = parse(["m", "--speculative-config", json.dumps(SPECULATIVE)])
    engine_args = EngineArgs.from_cli_args(args)
    assert engine_args.speculative_config == SpeculativeConfig(
        num_speculative_tokens=4, prompt_lookup_max=4, prompt_lookup_min=4
    )
    with pytest.raises(ValueError, match="method 'eagle' is not supported"):
        EngineArgs.from_cli_args(parse(["m", "--speculative-config", '{"method": "eagle"}']))


def test_a_speculating_server_answers_and_counts_its_drafts(tmp_path: Path) -> None:
    """The engine's counters under vLLM's metric names; the answer's text is the
    non-speculating server's (the scripted model answers the same to every prompt)."""
    save_scripted_model(str(tmp_path))
    answers = []
    for spec in (SPECULATIVE | {"prompt_lookup_min": 1}, None):
        llm = LLM(str(tmp_path), num_kv_blocks=16, max_model_len=64, speculative_config=spec)
        body = {"prompt": "Weather? Weather?", "max_tokens": 12, "temperature": 0}
        with TestClient(api_server.build_app(AsyncLLM(llm.llm_engine), ["m"])) as client:
            answers.append(client.post("/v1/completions", json=body).json()["choices"][0]["text"])
            metrics = client.get("/metrics").text
        assert ("vllm:spec_decode_num_draft_tokens_total" in metrics) == (spec is not None)
        llm.close()
    assert answers[0] == answers[1]


def test_request_ids_and_default_template_arguments_reach_the_answer(
    tmp_path: Path, tiny_model_path: Callable[[str], str]
) -> None:
    save_scripted_model(str(tmp_path))
    llm = LLM(str(tmp_path), num_kv_blocks=16, max_model_len=64)
    app = api_server.build_app(
        AsyncLLM(llm.llm_engine),
        ["m"],
        default_chat_template_kwargs={"enable_thinking": False},
        request_id_headers=True,
    )
    messages = [{"role": "user", "content": "Weather?"}]
    with TestClient(app) as client:
        echoed = client.get("/health", headers={"X-Request-Id": "abc"})
        assert echoed.headers["x-request-id"] == "abc"
        assert len(client.get("/health").headers["x-request-id"]) == 32
        answer = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 1})
        assert answer.json()["id"] == f"chatcmpl-{answer.headers['x-request-id']}"
        closed = client.post("/tokenize", json={"messages": messages}).json()["tokens"]
        opened = client.post(
            "/tokenize",
            json={"messages": messages, "chat_template_kwargs": {"enable_thinking": True}},
        ).json()["tokens"]
    tokenizer = llm.get_tokenizer()
    assert "<think></think>" in tokenizer.decode(closed), "the server's default applies"
    assert "<think>" not in tokenizer.decode(opened), "the request's own wins"
    llm.close()


def test_forced_usage_is_in_every_chunk_of_every_stream(tmp_path: Path) -> None:
    """vLLM's --enable-force-include-usage: usage in each chunk and a usage chunk at the
    end, with no stream_options asked."""
    save_scripted_model(str(tmp_path))
    llm = LLM(str(tmp_path), num_kv_blocks=16, max_model_len=64)
    app = api_server.build_app(AsyncLLM(llm.llm_engine), ["m"], force_include_usage=True)
    body = {"prompt": "user", "max_tokens": 3, "stream": True, "ignore_eos": True}
    with TestClient(app) as client:
        lines = client.post("/v1/completions", json=body).text.splitlines()
    chunks = [json.loads(x.removeprefix("data: ")) for x in lines if x.startswith("data: {")]
    assert all(chunk["usage"] is not None for chunk in chunks)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3
    llm.close()
