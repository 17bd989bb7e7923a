"""Soak: a few hundred concurrent streams, completions and chat, some with n=2, a seeded
fraction of them dropped by the client after a chunk or two. References: each finished
stream's own contract (every choice ends with finish_reason "length" under ignore_eos, then
[DONE]), and /metrics back at 0 running, 0 waiting and 0 KV blocks in use once every request
has ended; then a plain request still succeeds."""

import asyncio
import json
import random
import time
from dataclasses import dataclass
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from tests.entrypoints.openai.remote_server import Server

NUM_REQUESTS, SEED = 300, 0
DROP_FRACTION, N2_FRACTION, CHAT_FRACTION = 0.3, 0.2, 0.5
MIN_TOKENS, MAX_TOKENS = 4, 16
SOAK_TIMEOUT_S, IDLE_TIMEOUT_S = 180.0, 30.0
PROMPTS = [f"Count from {i} to {i + 5}:" for i in range(10)]
IDLE_GAUGES = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "pagedllm:kv_cache_blocks_in_use",
    "vllm:kv_cache_usage_perc",
)


@dataclass(frozen=True)
class Plan:
    """One soak request: where it goes, its body, and after how many chunks the client
    disconnects (None: it reads the stream to the end)."""

    path: str
    body: dict[str, Any]
    drop_after: int | None


@dataclass(frozen=True)
class Outcome:
    status: int
    finish_reasons: dict[int, str]
    done: bool


def make_plan(rng: random.Random) -> Plan:
    n = 2 if rng.random() < N2_FRACTION else 1
    common = {"n": n, "max_tokens": rng.randint(MIN_TOKENS, MAX_TOKENS), "ignore_eos": True}
    common |= {"temperature": rng.choice([0.0, 0.8]), "seed": rng.randrange(1000), "stream": True}
    prompt, drop_after = rng.choice(PROMPTS), None
    if rng.random() < DROP_FRACTION:  # long enough that the drop comes before the finish
        common["max_tokens"], drop_after = MAX_TOKENS, rng.randint(1, 2)
    if rng.random() < CHAT_FRACTION:
        messages = [{"role": "user", "content": prompt}]
        return Plan("/v1/chat/completions", {**common, "messages": messages}, drop_after)
    return Plan("/v1/completions", {**common, "prompt": prompt}, drop_after)


async def run_stream(client: httpx.AsyncClient, plan: Plan) -> Outcome:
    """Read `plan`'s SSE stream, leaving after `plan.drop_after` chunks if it says so."""
    finish_reasons, chunks = {}, 0
    async with client.stream("POST", plan.path, json=plan.body) as response:
        if response.status_code != 200:
            return Outcome(response.status_code, {}, False)
        async for line in response.aiter_lines():
            if line == "data: [DONE]":
                return Outcome(200, finish_reasons, True)
            if not line.startswith("data: "):
                continue
            for choice in json.loads(line.removeprefix("data: "))["choices"]:
                if choice["finish_reason"] is not None:
                    finish_reasons[choice["index"]] = choice["finish_reason"]
            chunks += 1
            if chunks == plan.drop_after:
                break
    return Outcome(200, finish_reasons, False)


async def run_soak(server: Server, plans: list[Plan]) -> list[Outcome]:
    limits = httpx.Limits(max_connections=len(plans), max_keepalive_connections=len(plans))
    timeout = httpx.Timeout(SOAK_TIMEOUT_S, connect=30.0)
    async with httpx.AsyncClient(base_url=server.url, timeout=timeout, limits=limits) as client:
        streams = asyncio.gather(*(run_stream(client, plan) for plan in plans))
        return await asyncio.wait_for(streams, SOAK_TIMEOUT_S)


def samples(server: Server) -> list[Sample]:
    """/metrics now, read by prometheus_client's own text parser."""
    text = httpx.get(server.url + "/metrics", timeout=10).text
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


def finished_choices(server: Server) -> float:
    """Choices that ran to a finish reason (not those counted as "abort")."""
    return sum(
        s.value
        for s in samples(server)
        if s.name == "vllm:request_success_total" and s.labels["finished_reason"] != "abort"
    )


def idle_gauges(server: Server) -> dict[str, float]:
    gauges = {s.name: s.value for s in samples(server) if s.name in IDLE_GAUGES}
    assert set(gauges) == set(IDLE_GAUGES), f"/metrics lacks {set(IDLE_GAUGES) - set(gauges)}"
    return gauges


def wait_until_idle(server: Server) -> dict[str, float]:
    """The idle gauges once all are 0, or their last values after IDLE_TIMEOUT_S."""
    deadline = time.monotonic() + IDLE_TIMEOUT_S
    gauges = idle_gauges(server)
    while any(gauges.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
        gauges = idle_gauges(server)
    return gauges


def test_soak_of_dropped_and_finished_streams_leaves_the_engine_idle(server: Server) -> None:
    rng = random.Random(SEED)
    plans = [make_plan(rng) for _ in range(NUM_REQUESTS)]
    finished_before = finished_choices(server)
    outcomes = asyncio.run(run_soak(server, plans))
    for i, (plan, outcome) in enumerate(zip(plans, outcomes, strict=True)):
        assert outcome.status == 200, f"request {i}: {plan}"
        if plan.drop_after is None:
            assert outcome.done, f"request {i} ended without [DONE]: {plan}"
            expected = dict.fromkeys(range(plan.body["n"]), "length")
            assert outcome.finish_reasons == expected, f"request {i}: {plan}"
    gauges = wait_until_idle(server)
    assert not any(gauges.values()), f"not idle {IDLE_TIMEOUT_S} s after the soak: {gauges}"
    read_to_the_end = sum(plan.body["n"] for plan in plans if plan.drop_after is None)
    assert finished_choices(server) - finished_before == read_to_the_end  # the rest aborted
    body = {"prompt": PROMPTS[0], "max_tokens": MIN_TOKENS, "ignore_eos": True}
    answer = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["completion_tokens"] == MIN_TOKENS
