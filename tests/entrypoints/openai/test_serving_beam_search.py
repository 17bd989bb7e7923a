"""use_beam_search on /v1/completions and /v1/chat/completions
(pagedllm/entrypoints/openai/serving_beam_search.py). Reference: the offline
`LLM.beam_search` on the same engine and prompt ids (the same search, vLLM's), its beams'
generated tokens and text as the choices, best first; vLLM's request fields (n beams,
length_penalty, max_tokens, temperature); a field the search would not apply is a 400."""

import asyncio
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient

from pagedllm import LLM
from pagedllm.engine.async_llm import AsyncLLM
from pagedllm.entrypoints.openai import api_server
from pagedllm.entrypoints.openai.errors import OpenAIError
from pagedllm.entrypoints.openai.protocol import CompletionRequest
from pagedllm.entrypoints.openai.serving_beam_search import (
    BeamSearchRequest,
    beam_search_outputs,
    beam_search_request,
)
from pagedllm.lora.request import LoRARequest
from pagedllm.sampling_params import BeamSearchParams, SamplingParams
from tests.entrypoints.openai.app_client import post

BEAM = {"use_beam_search": True, "n": 3, "temperature": 0, "length_penalty": 0.5}


def serve(offline_llm: LLM) -> TestClient:
    """The app over the offline LLM's engine, to use in a `with`: the reference runs once
    it is closed (one driver of the engine at a time)."""
    return TestClient(api_server.build_app(AsyncLLM(offline_llm.llm_engine), ["m"]))


@pytest.fixture
def http(offline_llm: LLM) -> Iterator[TestClient]:
    with serve(offline_llm) as client:
        yield client


def offline_beams(llm: LLM, prompt_ids: list[int], max_tokens: int) -> list[list]:
    """[generated token ids, their text, finish reason] of each of LLM.beam_search's beams,
    best first; a beam that ended at EOS ("stop") without its EOS, as vLLM's server."""
    params = BeamSearchParams(beam_width=3, max_tokens=max_tokens, length_penalty=0.5)
    (output,) = llm.beam_search([{"prompt_token_ids": prompt_ids}], params)
    decode = llm.get_tokenizer().decode
    beams = []
    for s in output.sequences:
        ids = s.tokens[len(prompt_ids) : -1 if s.finish_reason == "stop" else None]
        beams.append([ids, decode(ids, skip_special_tokens=True), s.finish_reason])
    return beams


def test_completion_beams_are_llm_beam_searchs(offline_llm: LLM) -> None:
    """Two prompts: choice i * n + k is prompt i's k-th best beam. The first has a beam
    that ends at EOS: include_stop_str_in_output keeps the EOS in its token ids."""
    body = {"prompt": ["The capital of France is", "1, 2, 3,"], "max_tokens": 5, **BEAM}
    body["return_token_ids"] = True
    with serve(offline_llm) as http:
        answer = post(http, "/v1/completions", body)
        with_eos = post(http, "/v1/completions", {**body, "include_stop_str_in_output": True})
    assert [c["index"] for c in answer["choices"]] == list(range(6))
    for i in range(2):
        choices = answer["choices"][3 * i : 3 * i + 3]
        expected = offline_beams(offline_llm, choices[0]["prompt_token_ids"], 5)
        got = [[c["token_ids"], c["text"], c["finish_reason"]] for c in choices]
        assert got == expected
    eos = offline_llm.get_tokenizer().eos_token_id
    pairs = zip(answer["choices"], with_eos["choices"])
    stopped = [(c, e) for c, e in pairs if c["finish_reason"] == "stop"]
    assert stopped, "the test needs a beam that ends at EOS"
    for c, e in stopped:
        assert e["token_ids"] == [*c["token_ids"], eos] and e["text"] == c["text"]
    completion_tokens = sum(len(c["token_ids"]) for c in answer["choices"])
    assert answer["usage"]["completion_tokens"] == completion_tokens


def test_chat_beams_are_llm_beam_searchs(offline_llm: LLM) -> None:
    messages = [{"role": "user", "content": "Name a colour."}]
    body = {"messages": messages, "max_tokens": 4, "return_token_ids": True, **BEAM}
    with serve(offline_llm) as http:
        answer = post(http, "/v1/chat/completions", body)
    expected = offline_beams(offline_llm, answer["prompt_token_ids"], 4)
    got = [[c["token_ids"], c["message"]["content"], c["finish_reason"]] for c in answer["choices"]]
    assert got == expected
    assert all(c["message"]["role"] == "assistant" for c in answer["choices"])


def test_a_stream_sends_each_beam_whole(http: TestClient) -> None:
    """The answer comes when the search ends: one chunk per choice, then the usage."""
    body = {"prompt": "Once upon a time", "max_tokens": 4, **BEAM}
    whole = post(http, "/v1/completions", body)
    chunks = post(
        http, "/v1/completions", {**body, "stream": True, "stream_options": {"include_usage": True}}
    )
    streamed = [c["choices"][0] for c in chunks[:-1]]
    assert [(c["index"], c["text"], c["finish_reason"]) for c in streamed] == [
        (c["index"], c["text"], c["finish_reason"]) for c in whole["choices"]
    ]
    assert chunks[-1]["usage"] == whole["usage"]


def test_logprobs_are_each_tokens_step_candidates(http: TestClient) -> None:
    """A beam's cumulative logprob is the sum of its tokens' (greedy steps' logprobs);
    each token's alternatives: the chosen one and the `logprobs` best."""
    body = {"prompt": "Once upon a time", "max_tokens": 4, "logprobs": 2, **BEAM}
    answer = post(http, "/v1/completions", {**body, "length_penalty": 0.0})
    for choice in answer["choices"]:
        logprobs = choice["logprobs"]
        assert len(logprobs["tokens"]) == 4
        assert all(2 <= len(top) <= 3 for top in logprobs["top_logprobs"])
    sums = [sum(c["logprobs"]["token_logprobs"]) for c in answer["choices"]]
    assert sums == sorted(sums, reverse=True)  # length_penalty 0: ranked by the sum


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"stop": ["\n"]}, "stop"),
        ({"top_p": 0.5}, "top_p"),
        ({"response_format": {"type": "json_object"}}, "structured_outputs"),
        ({"echo": True, "logprobs": 1}, "logprobs"),
        ({"n": 11}, "n"),  # 22 candidates a step: more than max_logprobs (20)
        ({"length_penalty": 1e39}, "length_penalty"),  # beyond float32
    ],
)
def test_what_the_search_cannot_apply_is_a_400(http: TestClient, extra: dict, param: str) -> None:
    body = {"prompt": "Hi", "max_tokens": 2, **BEAM, **extra}
    response = http.post("/v1/completions", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
    assert "beam" in response.json()["error"]["message"]


def test_chat_tools_constraint_is_a_400(http: TestClient) -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, **BEAM}
    body |= {"tools": [tool], "tool_choice": "required"}
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "structured_outputs"


def test_a_width_over_max_n_is_a_400_naming_n() -> None:
    """--max-n bounds the beam width as it bounds a sampled request's n, same message."""
    request = CompletionRequest(model="m", prompt="Hi", use_beam_search=True, n=5)
    with pytest.raises(OpenAIError, match=r"beam_width must be at most max_n=4") as error:
        beam_search_request(request, SamplingParams(n=5, max_tokens=2), 40, 4)
    assert error.value.param == "n"


class HangingEngine:
    """An engine whose requests never finish; it records which it started and closed."""

    config = SimpleNamespace(model_config=SimpleNamespace(max_model_len=64))

    def __init__(self) -> None:
        self.started: list[str] = []
        self.closed: list[str] = []
        self.asked: list[tuple] = []  # each request's prompt, priority and lora_request

    async def generate(  # noqa: ANN201
        self,
        prompt: dict,
        params: object,
        request_id: str,
        priority: int = 0,
        lora_request: LoRARequest | None = None,
    ):
        self.started.append(request_id)
        self.asked.append((prompt, priority, lora_request))
        try:
            await asyncio.Event().wait()
            yield
        finally:
            self.closed.append(request_id)


def test_cancelling_the_search_closes_its_step_requests() -> None:
    """A client that goes away cancels the search: its step's requests are closed (the
    engine aborts a request whose iterator closes), under ids of the search's own."""
    engine = asyncio.run(start_and_cancel({"prompt_token_ids": [1, 2]}))
    assert len(engine.started) == 1 and engine.started[0].startswith("cmpl-x-beam-")
    assert engine.closed == engine.started


def test_the_search_steps_keep_the_requests_priority_cache_salt_and_lora_request() -> None:
    lora = LoRARequest("sql", 1, "/adapters/sql")
    prompt = {"prompt_token_ids": [1, 2], "cache_salt": "s"}
    engine = asyncio.run(start_and_cancel(prompt, 3, lora))
    assert engine.asked == [({"prompt_token_ids": [1, 2], "cache_salt": "s"}, 3, lora)]


async def start_and_cancel(
    prompt: dict, priority: int = 0, lora_request: LoRARequest | None = None
) -> HangingEngine:
    """A search's first step started on a HangingEngine, then the search cancelled."""
    engine = HangingEngine()
    search = BeamSearchRequest(BeamSearchParams(beam_width=2, max_tokens=3), SamplingParams())
    outputs = beam_search_outputs(
        engine, None, prompt, search, "cmpl-x", [0], priority, lora_request
    )
    task = asyncio.ensure_future(anext(outputs))
    while not engine.started:
        await asyncio.sleep(0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return engine
