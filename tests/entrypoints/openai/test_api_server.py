"""The app of pagedllm/entrypoints/openai/api_server.py: its routes, continuous batching
across HTTP requests, aborts on disconnect (seen in /metrics), --api-key, --chat-template
and the CLI. References: the server's own non-streamed greedy answers, the tokenizer, and
the KV cache with no block in use once every request has ended."""

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from pagedllm import LLM
from pagedllm.config import ModelConfig, default_model_path
from pagedllm.engine.async_llm import AsyncLLM
from pagedllm.engine.batch_defaults import UsageContext
from pagedllm.engine.tokenizer import get_tokenizer
from pagedllm.entrypoints.openai import api_server
from tests.entrypoints.openai.remote_server import (
    MAX_MODEL_LEN,
    MODEL_NAME,
    NUM_KV_BLOCKS,
    Server,
    remote_server,
)

STREAM_PROMPTS = [f"Write the number {i} in words:" for i in range(8)]
NUM_STREAMS, NUM_DROPPED, MAX_TOKENS = 64, 10, 16


def metric(server: Server, name: str) -> float:
    """The value of a metric (the sum over its label sets)."""
    text = httpx.get(server.url + "/metrics").text
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name)]
    assert values, f"{name} is not in /metrics"
    return sum(values)


def successes(server: Server, reason: str) -> float:
    """vllm:request_success_total of one finished_reason, over the engines."""
    text = httpx.get(server.url + "/metrics").text
    label = f'finished_reason="{reason}"'
    lines = [line for line in text.splitlines() if line.startswith("vllm:request_success_total")]
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if label in line)


def wait_until_idle(server: Server, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        running = metric(server, "vllm:num_requests_running{")
        if running == 0 and metric(server, "pagedllm:kv_cache_blocks_in_use{") == 0:
            return
        time.sleep(0.05)
    raise AssertionError("KV blocks still in use after every request ended")


async def stream_text(client: httpx.AsyncClient, prompt: str, drop_after: int | None) -> str:
    """The streamed text, or "" after disconnecting once `drop_after` chunks arrived."""
    body = {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}
    text, chunks = "", 0
    async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            text += json.loads(line.removeprefix("data: "))["choices"][0]["text"]
            chunks += 1
            if chunks == drop_after:
                return ""
    return text


def test_concurrent_streams_match_greedy_and_dropped_ones_free_their_blocks(
    server: Server,
) -> None:
    body = {"prompt": STREAM_PROMPTS, "max_tokens": MAX_TOKENS, "temperature": 0}
    whole = httpx.post(
        server.url + "/v1/completions", json={**body, "ignore_eos": True}, timeout=60
    )
    expected = [c["text"] for c in whole.json()["choices"]]
    finished_before, aborted_before = successes(server, "length"), successes(server, "abort")
    dropped = {6 * i for i in range(NUM_DROPPED)}

    async def run_all() -> list[str]:
        limits = httpx.Limits(max_connections=NUM_STREAMS)
        async with httpx.AsyncClient(base_url=server.url, timeout=120, limits=limits) as client:
            calls = [
                stream_text(client, STREAM_PROMPTS[i % 8], 2 if i in dropped else None)
                for i in range(NUM_STREAMS)
            ]
            return await asyncio.gather(*calls)

    texts = asyncio.run(run_all())
    for i, text in enumerate(texts):
        assert text == ("" if i in dropped else expected[i % 8]), f"stream {i}"
    wait_until_idle(server)
    finished = successes(server, "length") - finished_before
    assert finished == NUM_STREAMS - NUM_DROPPED
    assert successes(server, "abort") - aborted_before == NUM_DROPPED  # as vLLM counts them


def test_non_streamed_request_is_aborted_when_the_client_leaves(server: Server) -> None:
    body = {"prompt": "Tell me a long story.", "max_tokens": 1000, "ignore_eos": True}
    with pytest.raises(httpx.TimeoutException):
        httpx.post(server.url + "/v1/completions", json=body, timeout=1.0)
    wait_until_idle(server)


def test_health_version_models_and_metrics(server: Server) -> None:
    assert httpx.get(server.url + "/health").status_code == 200
    assert httpx.get(server.url + "/version").json()["version"]
    models = httpx.get(server.url + "/v1/models").json()
    assert [m["id"] for m in models["data"]] == [MODEL_NAME]
    assert models["data"][0]["max_model_len"] == MAX_MODEL_LEN
    assert models["data"][0]["root"] == default_model_path()  # vLLM's: the model's path
    assert metric(server, "pagedllm:kv_cache_blocks_total{") == NUM_KV_BLOCKS
    for name in (
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:time_to_first_token_seconds_count",
        "vllm:time_per_output_token_seconds_count",
        "vllm:e2e_request_latency_seconds_count",
        "vllm:request_queue_time_seconds_count",
        "vllm:request_prefill_time_seconds_count",
        "vllm:request_decode_time_seconds_count",
        "vllm:request_inference_time_seconds_count",
        "vllm:request_params_max_tokens_count",
        "vllm:iteration_tokens_total_count",
        "vllm:cache_config_info",
        "vllm:kv_cache_usage_perc",
        "pagedllm:prefix_cache_hit_rate",
        "vllm:num_requests_waiting",
    ):
        metric(server, name)


def test_openapi_schema_describes_every_route(server: Server) -> None:
    schema = httpx.get(server.url + "/openapi.json").json()
    paths = schema["paths"]
    for path in ("/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"):
        assert "requestBody" in paths[path]["post"]
        assert "400" in paths[path]["post"]["responses"]
    for name in ("CompletionRequest", "CompletionResponse", "ChatCompletionResponse"):
        assert name in schema["components"]["schemas"]
    assert {"/v1/models", "/health", "/version", "/metrics"} <= set(paths)


# In-process apps over the offline LLM's engine (idle meanwhile, so it has one owner).

TEMPLATE = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"


def test_chat_template_is_a_file_or_the_template_itself(tmp_path: Path) -> None:
    """vLLM's rule: a file that opens is read; otherwise a value holding `{`, `}` or a
    newline is the template, its escapes decoded (other characters kept as they are); a
    value like a path that does not open is an error naming it."""
    path = tmp_path / "template.jinja"
    path.write_text(TEMPLATE)
    assert api_server.read_chat_template(str(path)) == TEMPLATE
    one_line = "{% for m in messages %}«{{ m['content'] }}» 中\\n{% endfor %}"
    assert api_server.read_chat_template(one_line) == one_line.replace("\\n", "\n")
    assert api_server.read_chat_template(TEMPLATE) == TEMPLATE
    with pytest.raises(ValueError, match="'missing.jinja' cannot be read"):
        api_server.read_chat_template("missing.jinja")
    with pytest.raises(ValueError, match="bad escape"):
        api_server.read_chat_template("{{ '\\x' }}")


@pytest.fixture
def app_client(offline_llm: LLM, tmp_path: Path) -> Iterator[TestClient]:
    path = tmp_path / "template.jinja"
    path.write_text(TEMPLATE)
    template = api_server.read_chat_template(str(path))
    app = api_server.build_app(
        AsyncLLM(offline_llm.llm_engine), ["my-model"], api_key="sekret", chat_template=template
    )
    with TestClient(app) as client:
        yield client


def test_api_key_guards_v1_routes_only(app_client: TestClient) -> None:
    good = {"Authorization": "Bearer sekret"}
    body = {"model": "my-model", "prompt": "Hi", "max_tokens": 2}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sekret"}):
        response = app_client.post("/v1/completions", json=body, headers=headers)
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "invalid_api_key"
    assert app_client.post("/v1/completions", content=b"{oops", headers={}).status_code == 401
    assert app_client.get("/v1/models").status_code == 401
    assert app_client.get("/v1/models", headers=good).json()["data"][0]["id"] == "my-model"
    answer = app_client.post("/v1/completions", json=body, headers=good).json()
    assert answer["usage"]["completion_tokens"] == 2
    assert app_client.get("/health").status_code == 200


def test_chat_template_file_replaces_the_models(app_client: TestClient, offline_llm: LLM) -> None:
    messages = [{"role": "user", "content": "Hi"}]
    tokens = app_client.post("/tokenize", json={"messages": messages}).json()["tokens"]
    assert tokens == offline_llm.get_tokenizer().encode("[user] Hi\n")


def test_cli_parser_and_bad_flags(capsys: pytest.CaptureFixture) -> None:
    parser = argparse.ArgumentParser()
    api_server.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["serve", "--port", "9001", "--max-model-len", "1024"])
    assert args.func is api_server.run and args.model is None
    assert (args.port, args.max_model_len, args.tensor_parallel_size) == (9001, 1024, 1)
    args = parser.parse_args(["serve", "some/model", "--served-model-name", "a", "b"])
    assert args.model == "some/model" and args.served_model_name == ["a", "b"]
    with pytest.raises(SystemExit) as exit_info:
        api_server.main(["--port", "70000"])
    assert exit_info.value.code == 2
    assert "--port must be in [0, 65535]" in capsys.readouterr().err


def spawned_children(pid: int) -> list[int]:
    """The multiprocessing-spawned children of process `pid` (its tensor-parallel workers)."""
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        children = [int(child) for child in f.read().split()]
    spawned = []
    for child in children:
        with open(f"/proc/{child}/cmdline", "rb") as f:
            if b"spawn_main" in f.read():
                spawned.append(child)
    return spawned


def test_server_exits_nonzero_when_its_engine_dies(tiny_model_path, tmp_path: Path) -> None:
    """A SIGKILLed tensor-parallel worker kills the engine: /health turns 503 and the
    process exits with status 1 within seconds, for a supervisor to restart (as vLLM)."""
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_path("llama-gqa4"), folder)
    get_tokenizer(ModelConfig.create(None, "auto", None, "cpu")).save_pretrained(folder)
    flags = ("--tensor-parallel-size", "2", "--max-model-len", "128")
    with remote_server(*flags, model=str(folder)) as server:
        (worker,) = spawned_children(server.process.pid)
        os.kill(worker, signal.SIGKILL)
        start = time.monotonic()
        returncode = server.process.wait(timeout=30)
        assert time.monotonic() - start < 15
        assert returncode == 1, server.log()
        assert "the engine died" in server.log()


def test_the_server_builds_its_engine_as_vllms_server(monkeypatch) -> None:
    """The server's default steps are vLLM's OPENAI_API_SERVER sizes (batch_defaults)."""
    built = []

    def from_engine_args(engine_args):
        built.append(engine_args)
        raise ValueError("stop here")

    monkeypatch.setattr(api_server.AsyncLLM, "from_engine_args", from_engine_args)
    parser = argparse.ArgumentParser()
    api_server.add_parser(parser.add_subparsers(dest="command"))
    with pytest.raises(ValueError, match="stop here"):
        api_server.run(parser.parse_args(["serve", "--device", "cpu", "--port", "0"]))
    assert built[0].usage_context is UsageContext.OPENAI_API_SERVER


def test_a_port_in_use_is_refused_before_the_engine_starts(monkeypatch) -> None:
    """vLLM binds the API's socket first: a taken port is a ValueError (the CLI's exit 2)
    naming it, and no model is loaded."""
    monkeypatch.setattr(AsyncLLM, "from_engine_args", lambda *a: pytest.fail("engine built"))
    parser = argparse.ArgumentParser()
    api_server.add_parser(parser.add_subparsers(dest="command"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ValueError, match=f"cannot listen at 127.0.0.1:{port} .*in use"):
            api_server.run(parser.parse_args(["serve", "--port", str(port)]))
    (free,) = api_server.bind_server_sockets("127.0.0.1", 0)
    with free:
        assert free.getsockname()[1] > 0


def test_every_address_of_the_host_is_bound_on_one_port() -> None:
    """As asyncio's server binds a name: each address it resolves to (IPv4 and, where the
    machine has one, IPv6), port 0 shared."""
    sockets = api_server.bind_server_sockets("localhost", 0)
    try:
        ports = {sock.getsockname()[1] for sock in sockets}
        families = {sock.family for sock in sockets}
        assert len(ports) == 1 and ports != {0} and socket.AF_INET in families
        for sock in sockets:
            sock.listen()  # as uvicorn's asyncio server does
        with socket.create_connection(("127.0.0.1", ports.pop()), timeout=5):
            pass
    finally:
        for sock in sockets:
            sock.close()


def test_sigterm_ends_the_open_requests_at_once() -> None:
    """vLLM's --shutdown-timeout 0: the process does not wait for the longest answer; an
    open request ends with a 503 (a stream with an error event), and the exit is prompt."""
    body = {"prompt": "Once upon a time", "max_tokens": 1900, "ignore_eos": True}
    results: dict[str, object] = {}

    def plain(url: str) -> None:
        results["plain"] = httpx.post(url + "/v1/completions", json=body, timeout=120)

    def stream(url: str) -> None:
        with httpx.stream(
            "POST", url + "/v1/completions", json={**body, "stream": True}, timeout=120
        ) as response:
            results["stream"] = [line for line in response.iter_lines() if line]

    with remote_server() as server:
        threads = [threading.Thread(target=f, args=(server.url,)) for f in (plain, stream)]
        for thread in threads:
            thread.start()
        while metric(server, "vllm:num_requests_running{") < 2:
            time.sleep(0.05)
        start = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        server.process.wait(timeout=30)
        assert time.monotonic() - start < 10, server.log()
        for thread in threads:
            thread.join(timeout=30)
        assert "Traceback" not in server.log()
    assert results["plain"].status_code == 503
    assert results["plain"].json()["error"]["code"] == "engine_dead"
    lines = results["stream"]
    assert lines[-1] == "data: [DONE]" and "engine_dead" in lines[-2], lines[-3:]


def stats_lines(server: Server) -> list[str]:
    return [line for line in server.log().splitlines() if "Engine 000: Avg prompt" in line]


def wait_for_stats_line(server: Server, text: str, timeout_s: float = 30) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = [line for line in stats_lines(server) if text in line]
        if found:
            return found[-1]
        time.sleep(0.05)
    raise AssertionError(f"no stats line with {text!r}:\n{server.log()}")


def test_stats_lines_are_logged_at_the_default_log_level() -> None:
    """vLLM's periodic line (engine/stat_logger.py) on the server's log, at its default
    level, every PAGEDLLM_LOG_STATS_INTERVAL seconds: one running request while it streams,
    none once the client left; an idle server adds no more lines."""
    body = {"model": MODEL_NAME, "prompt": "Count to a hundred:", "max_tokens": 200}
    body |= {"temperature": 0, "ignore_eos": True, "stream": True}
    with remote_server(env={"PAGEDLLM_LOG_STATS_INTERVAL": "0.2"}) as server:
        assert stats_lines(server) == []  # idle since start-up
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=120) as r:
            next(r.iter_lines())
            line = wait_for_stats_line(server, "Running: 1 reqs, Waiting: 0 reqs")
        assert line.startswith("INFO ") and "KV cache usage: " in line, line
        first = stats_lines(server)[0]  # the first token's interval: its prompt was counted
        assert "Avg prompt throughput: 0.0 tokens/s" not in first, first
        wait_for_stats_line(server, "Running: 0 reqs")
        time.sleep(0.5)
        settled = len(stats_lines(server))
        time.sleep(0.5)
        assert len(stats_lines(server)) == settled, server.log()


def test_bad_stats_interval_is_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setenv("VLLM_LOG_STATS_INTERVAL", "often")
    with pytest.raises(SystemExit) as exit_info:
        api_server.main(["--port", "0"])
    assert exit_info.value.code == 2
    assert "VLLM_LOG_STATS_INTERVAL='often' must be a number of seconds" in capsys.readouterr().err
