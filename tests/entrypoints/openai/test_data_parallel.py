"""`pagedllm serve --data-parallel-size 2`: two engine replicas behind one server answer a
mixed load as one engine does, each request once; a repeated prefix goes back to the
replica that cached it; a killed replica fails the open requests cleanly and the server
exits non-zero; each replica logs its own stats line."""

import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.entrypoints.openai.remote_server import MODEL_NAME, Server, remote_server

EXIT_TIMEOUT_S = 30
PROMPTS = [
    "The capital of France is",
    "Write a haiku about the sea.",
    "List three prime numbers:",
    "Why is the sky blue?",
    "def fibonacci(n):",
    "Translate to French: good morning",
]
LONG_PROMPT = (
    "Once upon a time, in a small village between the mountains and the sea, there lived "
    "an old fisherman who told stories to the children every evening by the harbour."
)


@pytest.fixture(scope="module")
def dp_server() -> Iterator[Server]:
    stats_every_200ms = {"PAGEDLLM_LOG_STATS_INTERVAL": "0.2"}
    with remote_server("--data-parallel-size", "2", env=stats_every_200ms) as server:
        yield server


def _client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def _answer(client: openai.OpenAI, kind: str, prompt: str) -> tuple[str, int]:
    """(text, completion tokens) of a greedy request of `kind`."""
    common = dict(model=MODEL_NAME, max_tokens=8, temperature=0)
    if kind == "completion":
        response = client.completions.create(prompt=prompt, **common)
        return response.choices[0].text, response.usage.completion_tokens
    messages = [{"role": "user", "content": prompt}]
    if kind == "chat":
        response = client.chat.completions.create(messages=messages, **common)
        return response.choices[0].message.content, response.usage.completion_tokens
    stream = client.chat.completions.create(
        messages=messages, stream=True, stream_options={"include_usage": True}, **common
    )
    text, tokens = "", 0
    for chunk in stream:
        text += "".join(c.delta.content or "" for c in chunk.choices)
        tokens = chunk.usage.completion_tokens if chunk.usage else tokens
    return text, tokens


def _mixed_load() -> list[tuple[str, str]]:
    kinds = ["completion", "chat", "stream"]
    return [(kinds[i % 3], prompt) for i, prompt in enumerate(PROMPTS * 2)]


def _per_engine(server: Server, name: str) -> dict[str, float]:
    """engine label -> value of the engine metric `name` (a counter's _total sample)."""
    text = httpx.get(server.url + "/metrics", timeout=10).text
    families = text_string_to_metric_families(text)
    return {s.labels["engine"]: s.value for f in families for s in f.samples if s.name == name}


def test_each_replica_logs_its_own_stats_line(dp_server: Server) -> None:
    """vLLM's per-engine LoggingStatLogger lines (engine/stat_logger.py): `Engine 000`
    and `Engine 001`, each with tokens of the requests its replica ran."""
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        list(pool.map(lambda p: _answer(_client(dp_server), "completion", p), PROMPTS))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        busy = re.findall(r"(Engine 00[01]): Avg prompt throughput: [1-9]", dp_server.log())
        if set(busy) == {"Engine 000", "Engine 001"}:
            return
        time.sleep(0.1)
    raise AssertionError(dp_server.log())


def test_mixed_load_is_answered_once_each_as_one_engine_answers(
    dp_server: Server, client: openai.OpenAI
) -> None:
    load = _mixed_load()
    before = _per_engine(dp_server, "vllm:generation_tokens_total")
    requests = _per_engine(dp_server, "vllm:e2e_request_latency_seconds_count")
    with ThreadPoolExecutor(len(load)) as pool:
        answers = list(pool.map(lambda job: _answer(_client(dp_server), *job), load))
    expected = [_answer(client, *job) for job in load]  # the one-engine server, one by one
    assert answers == expected
    after = _per_engine(dp_server, "vllm:generation_tokens_total")
    generated = {engine: after[engine] - before.get(engine, 0) for engine in after}
    assert sorted(generated) == ["0", "1"]
    assert all(n > 0 for n in generated.values()), generated  # both replicas took requests
    assert sum(generated.values()) == sum(tokens for _, tokens in answers)  # none ran twice
    # The server's request histograms carry the replica that ran each request.
    finished = _per_engine(dp_server, "vllm:e2e_request_latency_seconds_count")
    counted = {engine: finished[engine] - requests.get(engine, 0) for engine in finished}
    assert sorted(counted) == ["0", "1"] and all(n > 0 for n in counted.values()), counted
    assert sum(counted.values()) == len(load)


def test_a_repeated_prefix_goes_back_to_the_replica_that_cached_it(dp_server: Server) -> None:
    client = _client(dp_server)
    prompts = _per_engine(dp_server, "vllm:prompt_tokens_total")
    _answer(client, "completion", LONG_PROMPT)
    after = _per_engine(dp_server, "vllm:prompt_tokens_total")
    (owner,) = [engine for engine in after if after[engine] > prompts.get(engine, 0)]
    # Two other prompts, one each: the rotation among idle replicas would now pick the
    # other replica for the next request.
    _answer(client, "completion", PROMPTS[0])
    _answer(client, "completion", PROMPTS[1])
    hits = _per_engine(dp_server, "vllm:prefix_cache_hits_total")
    _answer(client, "completion", LONG_PROMPT + " One evening,")
    new_hits = _per_engine(dp_server, "vllm:prefix_cache_hits_total")
    gained = {engine: new_hits[engine] - hits[engine] for engine in new_hits}
    assert gained[owner] >= 16, gained  # at least the first block, from its cache
    assert all(n == 0 for engine, n in gained.items() if engine != owner), gained


def _engine_pids(server: Server) -> list[int]:
    pids = re.findall(r"data-parallel engine \d+: pid (\d+)", server.log())
    assert len(pids) == 2, server.log()
    return [int(pid) for pid in pids]


def _stream_until_error(client: openai.OpenAI, started: list) -> BaseException | None:
    stream = client.completions.create(
        model=MODEL_NAME,
        prompt=LONG_PROMPT,
        max_tokens=1500,
        extra_body={"ignore_eos": True},
        stream=True,
    )
    try:
        for _ in stream:
            started.append(True)
    except openai.APIError as e:
        return e
    return None


def test_a_killed_replica_fails_open_requests_and_stops_the_server(dp_server: Server) -> None:
    """Last in this file: it ends the module's server."""
    pids = _engine_pids(dp_server)
    client, started = _client(dp_server), []
    with ThreadPoolExecutor(2) as pool:
        errors = [pool.submit(_stream_until_error, client, started) for _ in range(2)]
        deadline = time.monotonic() + EXIT_TIMEOUT_S
        while len(started) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(pids[0], signal.SIGKILL)
        results = [e.result(timeout=EXIT_TIMEOUT_S) for e in errors]
    assert all(isinstance(e, openai.APIError) for e in results), results
    assert not any(isinstance(e, openai.APIConnectionError) for e in results), results
    assert all("engine" in str(e) for e in results), results
    try:
        code = dp_server.process.wait(timeout=EXIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the server did not exit:\n{dp_server.log()}")
    assert code != 0
    assert "data-parallel engine 0" in dp_server.log()
    time.sleep(0.5)
    assert not os.path.exists(f"/proc/{pids[1]}"), "the other replica outlived the server"
