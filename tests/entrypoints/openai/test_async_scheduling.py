"""`pagedllm serve --async-scheduling` (the default on a GPU, docs/gpus.md): concurrent
plain and streamed requests with seeded sampling, n > 1, stop strings, logprobs and a JSON
schema (its grammar applied a step late) get the synchronous server's answers, and streams
the clients drop while two steps are in flight are aborted, their blocks freed. Reference:
the shared test server, which schedules synchronously (on the CPU by default)."""

import asyncio
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from tests.entrypoints.openai.remote_server import MODEL_NAME, Server, remote_server
from tests.entrypoints.openai.test_api_server import (
    metric,
    stream_text,
    successes,
    wait_until_idle,
)

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
    "required": ["city", "population"],
    "additionalProperties": False,
}
REQUESTS = [
    ("completion", dict(prompt="The capital of France is", max_tokens=12, logprobs=2)),
    ("completion", dict(prompt="List three primes:", max_tokens=10, n=2, temperature=0.8, seed=3)),
    ("completion", dict(prompt="Write a haiku about the sea.", max_tokens=24, stop=["\n\n"])),
    ("stream", dict(prompt="def fibonacci(n):", max_tokens=20)),
    ("chat", dict(content="Why is the sky blue?", max_tokens=16)),
    (
        "chat",
        dict(
            content="Name a large city and its population, as JSON.",
            max_tokens=40,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "city", "schema": SCHEMA},
            },
        ),
    ),
    ("chat", dict(content="Count to five.", max_tokens=12, n=3, temperature=1.0, seed=11)),
]


@pytest.fixture(scope="module")
def async_server() -> Iterator[Server]:
    with remote_server("--async-scheduling") as server:
        yield server


def _answer(client: openai.OpenAI, kind: str, request: dict) -> list:
    """Each choice's text, finish reason and (completions) token logprobs."""
    common = dict(model=MODEL_NAME, temperature=0)
    if kind == "chat":
        request = dict(request)
        messages = [{"role": "user", "content": request.pop("content")}]
        response = client.chat.completions.create(messages=messages, **{**common, **request})
        return [(c.message.content, c.finish_reason) for c in response.choices]
    if kind == "stream":
        text = ""
        for chunk in client.completions.create(stream=True, **common, **request):
            text += "".join(c.text for c in chunk.choices)
        return [text]
    response = client.completions.create(**{**common, **request})
    return [
        (c.text, c.finish_reason, c.logprobs and c.logprobs.token_logprobs)
        for c in response.choices
    ]


def _answers(server: Server) -> list[list]:
    """Every request of REQUESTS, all at once, twice (the second round hits the prefix
    cache), so that they share steps."""
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    with ThreadPoolExecutor(max_workers=2 * len(REQUESTS)) as pool:
        futures = [pool.submit(_answer, client, *r) for r in REQUESTS * 2]
        return [f.result() for f in futures]


def test_concurrent_requests_get_the_synchronous_servers_answers(
    async_server: Server, server: Server
) -> None:
    assert "Async scheduling on" in async_server.log()
    assert "Async scheduling on" not in server.log()
    answers = _answers(async_server)
    assert answers == _answers(server)
    assert '"population"' in answers[5][0][0]


def test_dropped_streams_are_aborted_and_free_their_blocks(async_server: Server) -> None:
    """Every third of 24 streams is dropped after its second chunk, while the next step is
    already in flight; the others get their whole text, and only they count as finished."""
    aborted_before = successes(async_server, "abort")
    finished_before = metric(async_server, "vllm:request_success_total") - aborted_before
    prompts = [f"Write the number {i} in words:" for i in range(24)]

    async def run_all() -> list[str]:
        limits = httpx.Limits(max_connections=len(prompts))
        async with httpx.AsyncClient(base_url=async_server.url, timeout=120, limits=limits) as c:
            calls = [stream_text(c, p, 2 if i % 3 == 0 else None) for i, p in enumerate(prompts)]
            return await asyncio.gather(*calls)

    texts = asyncio.run(run_all())
    assert all(text for i, text in enumerate(texts) if i % 3)
    wait_until_idle(async_server)
    aborted = successes(async_server, "abort") - aborted_before
    finished = metric(async_server, "vllm:request_success_total") - aborted - finished_before
    assert finished == len(prompts) - len(prompts[::3])
    assert aborted == len(prompts[::3])
