"""`pagedllm bench serve` against a fake OpenAI server (http.server, in a thread) that streams
one chunk per requested token with known delays: the measured TTFT, ITL and token counts must
match what it was told to do."""

import json
import random
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pagedllm.benchmarks.datasets import random_requests

FIRST_DELAY_S, TOKEN_DELAY_S = 0.05, 0.01
NUM_PROMPTS = 8


class FakeCompletions(BaseHTTPRequestHandler):
    """GET /v1/models lists "fake"; POST /v1/completions streams max_tokens chunks, then a
    usage chunk and [DONE]. A prompt whose first token id is 99 gets HTTP 500."""

    def do_GET(self) -> None:
        self._send_json({"object": "list", "data": [{"id": "fake", "object": "model"}]})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert self.path == "/v1/completions" and body["stream"] and body["ignore_eos"]
        if body["prompt"][0] == 99:
            self.send_error(500, "boom")
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        time.sleep(FIRST_DELAY_S)
        for i in range(body["max_tokens"]):
            time.sleep(TOKEN_DELAY_S if i else 0)
            self._event({"model": body["model"], "choices": [{"index": 0, "text": "x"}]})
        usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": body["max_tokens"]}
        self._event({"choices": [], "usage": usage})
        self.wfile.write(b"data: [DONE]\n\n")

    def _event(self, chunk: dict) -> None:
        self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.flush()

    def _send_json(self, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def fake_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeCompletions)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _serve_argv(url: str, json_path: str, rate: str) -> list[str]:
    argv = ["serve", "--url", url, "--num-prompts", str(NUM_PROMPTS), "--request-rate", rate]
    return argv + [
        "--input-len",
        "3:9",
        "--output-len",
        "2:6",
        "--vocab-size",
        "90",
        "--json",
        json_path,
    ]


def test_serve_metrics_match_the_fake_server(
    run_bench: Callable[[list[str]], str], fake_server: str, tmp_path: object
) -> None:
    json_path = f"{tmp_path}/serve.json"
    out = run_bench(_serve_argv(fake_server, json_path, "inf"))
    report = json.load(open(json_path))
    m = report["results"]
    requests = random_requests(NUM_PROMPTS, (3, 9), (2, 6), vocab_size=90, seed=0)
    assert report["config"]["model"] == "fake"
    assert (m["completed"], m["failed"]) == (NUM_PROMPTS, 0)
    assert m["input_tokens"] == sum(r.prompt_len for r in requests)
    assert m["output_tokens"] == sum(r.output_len for r in requests)
    assert m["ttft_s"]["p50"] >= FIRST_DELAY_S
    assert m["itl_s"]["p50"] >= TOKEN_DELAY_S / 2  # gaps can shrink when a read was late
    assert m["ttft_s"]["mean"] < m["e2e_s"]["mean"]
    for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
        assert m[key]["p50"] <= m[key]["p90"] <= m[key]["p99"]
    assert m["request_throughput"] == pytest.approx(NUM_PROMPTS / m["duration_s"])
    total = m["input_tokens"] + m["output_tokens"]
    assert m["total_token_throughput"] == pytest.approx(total / m["duration_s"])
    assert f"{'Successful requests:':<40}{NUM_PROMPTS:>12d}" in out
    assert "Median TTFT (ms):" in out and "P99 ITL (ms):" in out


def test_serve_poisson_arrivals_take_their_gaps(
    run_bench: Callable[[list[str]], str], fake_server: str, tmp_path: object
) -> None:
    """Reference: the same seeded exponential gaps; the run lasts at least their sum."""
    rate = 40.0
    run_bench(_serve_argv(fake_server, f"{tmp_path}/serve.json", str(rate)))
    report = json.load(open(f"{tmp_path}/serve.json"))
    rng = random.Random(0)
    gaps = sum(rng.expovariate(rate) for _ in range(NUM_PROMPTS - 1))
    assert report["results"]["duration_s"] >= gaps + FIRST_DELAY_S


def test_serve_counts_failed_requests(
    run_bench: Callable[[list[str]], str],
    fake_server: str,
    tmp_path: object,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pagedllm.benchmarks import serve

    def requests_with_one_bad(*args: object) -> list:
        requests = random_requests(*args)
        requests[0].prompt_token_ids[0] = 99
        return requests

    monkeypatch.setattr(serve, "random_requests", requests_with_one_bad)
    out = run_bench(_serve_argv(fake_server, f"{tmp_path}/serve.json", "inf"))
    report = json.load(open(f"{tmp_path}/serve.json"))
    assert (report["results"]["completed"], report["results"]["failed"]) == (NUM_PROMPTS - 1, 1)
    assert "error: HTTP 500" in out
