"""Hostile requests to the running server, each with and without `stream`: every one gets
a 4xx with OpenAI's error body `{"error": {"message", "type", "param", "code"}}` before a
byte of a stream is sent, while a bystander stream started before them finishes normally,
and the server answers correctly afterwards. Reference: OpenAI's error format; the
bystander's greedy text from the same server before the attack."""

import json
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.entrypoints.openai.remote_server import Server

CMPL, CHAT_CMPL, TOKENIZE, DETOKENIZE = (
    "/v1/completions",
    "/v1/chat/completions",
    "/tokenize",
    "/detokenize",
)
CHAT = [{"role": "user", "content": "Hi"}]
BYSTANDER_TOKENS = 300
LONE = "\ud800"


def cmpl(**fields: object) -> dict:
    return {"prompt": "hi", "max_tokens": 4, **fields}


def chat(**fields: object) -> dict:
    return {"messages": CHAT, "max_tokens": 4, **fields}


def raw(text: str) -> bytes:
    """A body json.dumps can't write (NaN literals, invalid UTF-8, ...)."""
    return text.encode("utf-8", "surrogatepass")


def nested(depth: int) -> bytes:
    """A prompt inside `depth` lists (written by hand: json.dumps recurses)."""
    return raw('{"prompt": ' + "[" * depth + '"hi"' + "]" * depth + ', "max_tokens": 4}')


# id: (path, body, expected status)
CASES: dict[str, tuple[str, object, int]] = {
    # The reported defects.
    "temperature 1e39 with allowed ids": (
        CMPL,
        cmpl(temperature=1e39, allowed_token_ids=[1, 2, 3]),
        400,
    ),
    "n 2**40": (CMPL, cmpl(n=2**40, max_tokens=1), 400),
    "n 10000": (CMPL, cmpl(n=10000, max_tokens=1), 400),
    "seed 2**64": (CMPL, cmpl(seed=2**64, temperature=0.7), 400),
    "bad_words lone surrogate": (CMPL, cmpl(bad_words=[LONE]), 400),
    "prompt lone surrogate": (CMPL, cmpl(prompt=LONE + " hello"), 400),
    "tokenize lone surrogate": (TOKENIZE, {"prompt": LONE + " hello"}, 400),
    # Floats: NaN and infinities as numbers and strings, one past each limit.
    "temperature NaN literal": (CMPL, raw('{"prompt": "hi", "temperature": NaN}'), 400),
    "temperature Infinity literal": (CMPL, raw('{"prompt": "hi", "temperature": Infinity}'), 400),
    "temperature -Infinity literal": (CMPL, raw('{"prompt":"hi","temperature":-Infinity}'), 400),
    "temperature 'nan' string": (CMPL, cmpl(temperature="nan"), 400),
    "temperature 'inf' string": (CMPL, cmpl(temperature="inf"), 400),
    "temperature -0.001": (CMPL, cmpl(temperature=-0.001), 400),
    "temperature 1e400": (CMPL, raw('{"prompt": "hi", "temperature": 1e400}'), 400),
    "top_p 0": (CMPL, cmpl(top_p=0), 400),
    "top_p 1.0000001": (CHAT_CMPL, chat(top_p=1.0000001), 400),
    "top_p 'NaN'": (CHAT_CMPL, chat(top_p="NaN"), 400),
    "min_p 1.01": (CMPL, cmpl(min_p=1.01), 400),
    "min_p -0.01": (CMPL, cmpl(min_p=-0.01), 400),
    "presence_penalty 2.01": (CMPL, cmpl(presence_penalty=2.01), 400),
    "frequency_penalty -2.01": (CHAT_CMPL, chat(frequency_penalty=-2.01), 400),
    "frequency_penalty -Infinity": (
        CHAT_CMPL,
        raw('{"messages": [{"role": "user", "content": "Hi"}], "frequency_penalty": -Infinity}'),
        400,
    ),
    "repetition_penalty 0": (CMPL, cmpl(repetition_penalty=0), 400),
    "repetition_penalty 1e39": (CMPL, cmpl(repetition_penalty=1e39), 400),
    "logit_bias value 1e39": (CMPL, cmpl(logit_bias={"5": 1e39}), 400),
    "logit_bias value 'NaN'": (CMPL, cmpl(logit_bias={"5": "NaN"}), 400),
    "logit_bias key not an id": (CMPL, cmpl(logit_bias={"abc": 1}), 400),
    "logit_bias key -1": (CMPL, cmpl(logit_bias={"-1": 1}), 400),
    "logit_bias key lone surrogate": (CMPL, cmpl(logit_bias={LONE: 1}), 400),
    # Integers: one past each limit, and far past.
    "seed -2**63-1": (CMPL, cmpl(seed=-(2**63) - 1), 400),
    "n 0": (CMPL, cmpl(n=0), 400),
    "n 129": (CHAT_CMPL, chat(n=129), 400),
    "n times max_tokens over the cache": (CMPL, cmpl(n=128, max_tokens=1000), 400),
    "max_tokens 0": (CMPL, cmpl(max_tokens=0), 400),
    "max_tokens -1": (CMPL, cmpl(max_tokens=-1), 400),
    "max_tokens 2**63": (CMPL, cmpl(max_tokens=2**63), 400),
    "max_tokens past the context": (CHAT_CMPL, chat(max_tokens=2048), 400),
    "max_completion_tokens 0": (CHAT_CMPL, chat(max_completion_tokens=0), 400),
    "min_tokens over max_tokens": (CMPL, cmpl(min_tokens=5), 400),
    "min_tokens -1": (CMPL, cmpl(min_tokens=-1), 400),
    "top_k -2": (CMPL, cmpl(top_k=-2), 400),
    "top_k 2**64": (CMPL, cmpl(top_k=2**64), 400),
    "logprobs 21": (CMPL, cmpl(logprobs=21), 400),
    "logprobs -2": (CMPL, cmpl(logprobs=-2), 400),
    "top_logprobs 21": (CHAT_CMPL, chat(logprobs=True, top_logprobs=21), 400),
    "top_logprobs -1": (CHAT_CMPL, chat(logprobs=True, top_logprobs=-1), 400),
    "stop_token_ids -1": (CMPL, cmpl(stop_token_ids=[-1]), 400),
    "stop_token_ids 2**70": (CMPL, cmpl(stop_token_ids=[2**70]), 400),
    "allowed_token_ids empty": (CMPL, cmpl(allowed_token_ids=[]), 400),
    "allowed_token_ids past vocab": (CMPL, cmpl(allowed_token_ids=[99_999_999]), 400),
    "prompt token id past vocab": (CMPL, cmpl(prompt=[1, 99_999_999]), 400),
    "prompt token id -5": (CMPL, cmpl(prompt=[-5]), 400),
    "detokenize id -1": (DETOKENIZE, {"tokens": [-1]}, 400),
    "detokenize id 2**70": (DETOKENIZE, {"tokens": [2**70]}, 400),
    # Wrong types.
    "prompt int": (CMPL, cmpl(prompt=12), 400),
    "prompt null": (CMPL, cmpl(prompt=None), 400),
    "prompt object": (CMPL, cmpl(prompt={"a": 1}), 400),
    "prompt floats": (CMPL, cmpl(prompt=[1.5, 2.5]), 400),
    "prompt empty list": (CMPL, cmpl(prompt=[]), 400),
    "prompt empty string": (CMPL, cmpl(prompt=""), 400),
    "prompt list with a lone surrogate": (CMPL, cmpl(prompt=["ok", "x" + LONE]), 400),
    "n string": (CMPL, cmpl(n="many"), 400),
    "temperature list": (CMPL, cmpl(temperature=[]), 400),
    "stop int": (CMPL, cmpl(stop=5), 400),
    "stop list of ints": (CMPL, cmpl(stop=[1]), 400),
    "stop lone surrogate": (CMPL, cmpl(stop=LONE), 400),
    "stop empty string": (CMPL, cmpl(stop=[""]), 400),
    "bad_words blank": (CMPL, cmpl(bad_words=[" "]), 400),
    "logit_bias list": (CMPL, cmpl(logit_bias=[1]), 400),
    "echo not a bool": (CMPL, cmpl(echo="maybe"), 400),
    "stream not a bool": (CMPL, cmpl(stream="maybe"), 400),
    "stream_options wrong": (CMPL, cmpl(stream_options={"include_usage": "x"}), 400),
    "user int": (CMPL, cmpl(user=5), 400),
    "messages string": (CHAT_CMPL, {"messages": "hi"}, 400),
    "messages empty": (CHAT_CMPL, {"messages": []}, 400),
    "messages missing": (CHAT_CMPL, {"max_tokens": 4}, 400),
    "message role int": (CHAT_CMPL, chat(messages=[{"role": 5, "content": "hi"}]), 400),
    "message content lone surrogate": (
        CHAT_CMPL,
        chat(messages=[{"role": "user", "content": LONE}]),
        400,
    ),
    "message role lone surrogate": (
        CHAT_CMPL,
        chat(messages=[{"role": LONE, "content": "a"}]),
        400,
    ),
    "message image part": (
        CHAT_CMPL,
        chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
        400,
    ),
    "logprobs not a bool in chat": (CHAT_CMPL, chat(logprobs="x"), 400),
    "tokenize both prompt and messages": (TOKENIZE, {"prompt": "a", "messages": CHAT}, 400),
    "tokenize neither": (TOKENIZE, {}, 400),
    "tokenize prompt int": (TOKENIZE, {"prompt": 5}, 400),
    "tokenize add_special_tokens wrong": (
        TOKENIZE,
        {"prompt": "a", "add_special_tokens": "x"},
        400,
    ),
    "detokenize string": (DETOKENIZE, {"tokens": "abc"}, 400),
    "detokenize floats": (DETOKENIZE, {"tokens": [1.5]}, 400),
    "detokenize missing": (DETOKENIZE, {}, 400),
    "unknown model": (CMPL, cmpl(model="gpt-9"), 404),
    # Malformed bodies.
    "malformed JSON": (CMPL, b'{"prompt": "hi",', 400),
    "not an object": (CMPL, [1, 2], 400),
    "invalid UTF-8": (CMPL, b'{"prompt": "\xff\xfe hi"}', 400),
    "deeply nested": (CMPL, nested(100_000), 400),
    "nested prompt lists": (CMPL, nested(50), 400),
    "a number of 5000 digits": (CMPL, raw('{"prompt": "hi", "n": ' + "9" * 5000 + "}"), 400),
    "body over 32 MiB": (CMPL, cmpl(prompt="a" * (33 * 1024 * 1024)), 413),
}


def send(url: str, path: str, body: object, stream: bool) -> httpx.Response:
    if isinstance(body, dict) and "stream" not in body:
        body = {**body, "stream": stream}
    if isinstance(body, bytes):
        content = body
    else:
        content = json.dumps(body).encode("utf-8", "surrogatepass")
    headers = {"Content-Type": "application/json"}
    return httpx.post(url + path, content=content, headers=headers, timeout=60)


@pytest.fixture(scope="module")
def bystander(server: Server) -> Iterator[dict]:
    """A long greedy stream, running while the hostile requests arrive."""
    result: dict = {}

    def run() -> None:
        body = {"prompt": "Once upon a time", "max_tokens": BYSTANDER_TOKENS}
        body.update(temperature=0, ignore_eos=True, stream=True)
        texts, reasons = [], []
        with httpx.stream("POST", server.url + CMPL, json=body, timeout=300) as response:
            result["status"] = response.status_code
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    choice = json.loads(line[6:])["choices"][0]
                    texts.append(choice["text"])
                    reasons.append(choice["finish_reason"])
        result["chunks"], result["text"], result["reasons"] = len(texts), "".join(texts), reasons

    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(1.0)  # let it start generating
    yield result
    thread.join(timeout=300)
    result["alive"] = thread.is_alive()


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("path, body, status", CASES.values(), ids=CASES.keys())
def test_hostile_request_gets_4xx(
    server: Server, bystander: dict, path: str, body: object, status: int, stream: bool
) -> None:
    response = send(server.url, path, body, stream)
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json"), response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["message"]


def test_hostile_cases_cover_every_route() -> None:
    assert len(CASES) >= 60
    assert {path for path, _, _ in CASES.values()} == {CMPL, CHAT_CMPL, TOKENIZE, DETOKENIZE}


def test_wrong_content_type_and_method(server: Server) -> None:
    form = httpx.post(
        server.url + CMPL, content=b"prompt=hi", headers={"Content-Type": "text/plain"}
    )
    assert form.status_code == 400 and "error" in form.json()
    for path in (CMPL, CHAT_CMPL, TOKENIZE, DETOKENIZE):
        response = httpx.get(server.url + path)
        assert response.status_code == 405 and "error" in response.json()


def test_chunked_body_over_the_limit_gets_413(server: Server) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"prompt": "'
        for _ in range(33):
            yield b"a" * (1024 * 1024)
        yield b'"}'

    response = httpx.post(
        server.url + CMPL, content=chunks(), headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 413, response.text
    assert "max-request-bytes" in response.json()["error"]["message"]


def test_bystander_finished_normally_and_server_still_answers(
    server: Server, bystander: dict
) -> None:
    """Runs after the hostile cases (pytest keeps file order)."""
    body = {"prompt": "Once upon a time", "max_tokens": BYSTANDER_TOKENS}
    body.update(temperature=0, ignore_eos=True)
    after = httpx.post(server.url + CMPL, json=body, timeout=300)
    assert after.status_code == 200
    choice = after.json()["choices"][0]
    assert bystander["status"] == 200
    assert bystander["reasons"][-1] == "length" and bystander["reasons"].count("length") == 1
    assert bystander["text"] == choice["text"] and choice["finish_reason"] == "length"
    assert httpx.get(server.url + "/health").status_code == 200


def test_huge_prompt_does_not_stall_other_clients(server: Server) -> None:
    """A 10 MB prompt is tokenized off the event loop: /health answers meanwhile."""
    body = json.dumps({"prompt": "hello world " * 850_000, "max_tokens": 1}).encode()
    result: dict = {}

    def post() -> None:
        result["response"] = httpx.post(
            server.url + CMPL,
            content=body,
            headers={"Content-Type": "application/json"},
            timeout=120,
        )

    thread = threading.Thread(target=post)
    thread.start()
    worst = 0.0
    while thread.is_alive():
        start = time.monotonic()
        assert httpx.get(server.url + "/health", timeout=10).status_code == 200
        worst = max(worst, time.monotonic() - start)
        time.sleep(0.05)
    thread.join()
    assert result["response"].status_code == 400
    assert "context length" in result["response"].json()["error"]["message"]
    assert worst < 1.0, f"/health took {worst:.2f} s while a huge prompt was tokenized"
