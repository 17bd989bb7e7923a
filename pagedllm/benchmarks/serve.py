"""`pagedllm bench serve`: load an OpenAI-compatible server with streaming /v1/completions.

Requests arrive as a Poisson process at --request-rate per second (inf: all at once). Each
prompt is a list of random token ids (the OpenAI API accepts token ids as the prompt, so its
length is exact), asks for its output length with ignore_eos, and streams the answer:
TTFT is the time to the first chunk with choices, ITL the gaps between later chunks, TPOT
(E2E - TTFT) / (output tokens - 1). Output tokens come from the final usage chunk when the
server sends one, else one per chunk.
"""

import argparse
import asyncio
import json
import math
import random
import time
from dataclasses import dataclass, field

import httpx

from pagedllm.benchmarks.datasets import BenchRequest, parse_len_range, random_requests
from pagedllm.benchmarks.metrics import summarize

_TIMEOUT = httpx.Timeout(6 * 3600.0, connect=30.0)


@dataclass
class RequestRecord:
    prompt_len: int
    success: bool = False
    error: str = ""
    output_tokens: int = 0
    ttft_s: float = 0.0
    e2e_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)


def completion_body(model: str, request: BenchRequest) -> dict:
    return {
        "model": model,
        "prompt": request.prompt_token_ids,
        "max_tokens": request.output_len,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def send_request(
    client: httpx.AsyncClient, url: str, model: str, request: BenchRequest
) -> RequestRecord:
    record = RequestRecord(request.prompt_len)
    start = last = time.perf_counter()
    chunks, usage = 0, None
    try:
        async with client.stream("POST", url, json=completion_body(model, request)) as response:
            if response.status_code != 200:
                body = (await response.aread()).decode(errors="replace")
                record.error = f"HTTP {response.status_code}: {body[:200]}"
                return record
            async for line in response.aiter_lines():
                data = line.removeprefix("data:").strip()
                if not line.startswith("data:") or data == "[DONE]":
                    continue
                chunk = json.loads(data)
                usage = chunk.get("usage") or usage
                if not chunk.get("choices"):
                    continue
                now = time.perf_counter()
                if chunks == 0:
                    record.ttft_s = now - start
                else:
                    record.itl_s.append(now - last)
                chunks, last = chunks + 1, now
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        record.error = f"{type(e).__name__}: {e}"
        return record
    record.e2e_s = time.perf_counter() - start
    record.output_tokens = usage["completion_tokens"] if usage else chunks
    record.prompt_len = usage["prompt_tokens"] if usage else request.prompt_len
    record.success = chunks > 0
    record.error = "" if chunks else "no chunk with choices"
    return record


async def run_requests(
    base_url: str, model: str, requests: list[BenchRequest], request_rate: float, seed: int
) -> tuple[list[RequestRecord], float]:
    """Send every request at its Poisson arrival time; (records in input order, duration)."""
    rng = random.Random(seed)
    url = base_url.rstrip("/") + "/v1/completions"
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=_TIMEOUT, limits=limits) as client:
        start, tasks = time.perf_counter(), []
        for i, request in enumerate(requests):
            if i and not math.isinf(request_rate):
                await asyncio.sleep(rng.expovariate(request_rate))
            tasks.append(asyncio.create_task(send_request(client, url, model, request)))
        records = await asyncio.gather(*tasks)
    return list(records), time.perf_counter() - start


def served_model(base_url: str) -> str:
    """The first model that GET /v1/models lists."""
    response = httpx.get(base_url.rstrip("/") + "/v1/models", timeout=30.0)
    response.raise_for_status()
    models = response.json().get("data") or []
    if not models:
        raise ValueError(f"{base_url}/v1/models lists no model; pass --model")
    return models[0]["id"]


def serving_metrics(records: list[RequestRecord], duration: float) -> dict:
    done = [r for r in records if r.success]
    input_tokens = sum(r.prompt_len for r in done)
    output_tokens = sum(r.output_tokens for r in done)
    tpots = [(r.e2e_s - r.ttft_s) / (r.output_tokens - 1) for r in done if r.output_tokens > 1]
    itls = [t for r in done for t in r.itl_s]
    metrics = {
        "completed": len(done),
        "failed": len(records) - len(done),
        "errors": sorted({r.error for r in records if r.error})[:5],
        "duration_s": duration,
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "request_throughput": len(done) / duration,
        "output_throughput": output_tokens / duration,
        "total_token_throughput": (input_tokens + output_tokens) / duration,
    }
    series = {"ttft_s": [r.ttft_s for r in done], "tpot_s": tpots, "itl_s": itls}
    series["e2e_s"] = [r.e2e_s for r in done]
    metrics |= {name: summarize(values) for name, values in series.items() if values}
    return metrics


def run_serve(args: argparse.Namespace) -> dict:
    if not args.request_rate > 0:
        raise ValueError(f"--request-rate {args.request_rate} must be > 0 (inf: all at once)")
    if args.vocab_size < 2:
        raise ValueError(f"--vocab-size {args.vocab_size} must be >= 2")
    input_len = parse_len_range(args.input_len, "--input-len")
    output_len = parse_len_range(args.output_len, "--output-len")
    requests = random_requests(args.num_prompts, input_len, output_len, args.vocab_size, args.seed)
    model = args.model or served_model(args.url)
    records, duration = asyncio.run(
        run_requests(args.url, model, requests, args.request_rate, args.seed)
    )
    config = {"url": args.url, "model": model, "num_prompts": args.num_prompts}
    config |= {"request_rate": args.request_rate, "seed": args.seed}
    config |= {"input_len": list(input_len), "output_len": list(output_len)}
    return {"benchmark": "serve", "config": config, "results": serving_metrics(records, duration)}


def format_serve(report: dict) -> str:
    m = report["results"]
    rows = [
        ("Successful requests", m["completed"], "d"),
        ("Failed requests", m["failed"], "d"),
        ("Benchmark duration (s)", m["duration_s"], ".2f"),
        ("Total input tokens", m["input_tokens"], "d"),
        ("Total generated tokens", m["output_tokens"], "d"),
        ("Request throughput (req/s)", m["request_throughput"], ".2f"),
        ("Output token throughput (tok/s)", m["output_throughput"], ".2f"),
        ("Total token throughput (tok/s)", m["total_token_throughput"], ".2f"),
    ]
    lines = [f"{name + ':':<40}{value:>12{spec}}" for name, value, spec in rows]
    lines += [f"error: {e}" for e in m["errors"]]
    for label, key in (("TTFT", "ttft_s"), ("TPOT", "tpot_s"), ("ITL", "itl_s"), ("E2E", "e2e_s")):
        if key not in m:
            continue
        for stat, name in (("mean", "Mean"), ("p50", "Median"), ("p99", "P99")):
            lines.append(f"{f'{name} {label} (ms):':<40}{1000 * m[key][stat]:>12.2f}")
    return "\n".join(lines)
