"""POST /v1/completions through the official `openai` client. Reference: the offline
`LLM.generate` of the same model for the same prompts and sampling parameters."""

import itertools
import json
import time
from collections.abc import Iterator

import openai
import pytest
from fastapi.testclient import TestClient

from pagedllm import LLM, SamplingParams
from pagedllm.engine.async_llm import AsyncLLM
from pagedllm.entrypoints.openai import api_server
from tests.entrypoints.openai.app_client import app_over, post
from tests.entrypoints.openai.remote_server import MODEL_NAME
from tests.entrypoints.openai.scripted_model import save_scripted_model

PROMPTS = ["The capital of France is", "Once upon a time", "1, 2, 3, 4,"]


def offline(llm: LLM, prompts: list, **params: object) -> list:
    return llm.generate(prompts, SamplingParams(**params), use_tqdm=False)


def test_greedy_batch_matches_offline_llm_with_usage(
    client: openai.OpenAI, offline_llm: LLM
) -> None:
    response = client.completions.create(
        model=MODEL_NAME, prompt=PROMPTS, max_tokens=12, temperature=0
    )
    expected = offline(offline_llm, PROMPTS, max_tokens=12, temperature=0)
    assert [c.index for c in response.choices] == [0, 1, 2]
    assert [c.text for c in response.choices] == [e.outputs[0].text for e in expected]
    assert response.usage.prompt_tokens == sum(len(e.prompt_token_ids) for e in expected)
    assert response.usage.completion_tokens == sum(len(e.outputs[0].token_ids) for e in expected)
    assert response.usage.total_tokens == response.usage.prompt_tokens + 12 * 3
    assert response.choices[0].finish_reason == "length"


def test_stream_concatenates_to_the_non_streamed_text(client: openai.OpenAI) -> None:
    """Token-id prompts, n=2 over two prompts: choice i * n + k; usage chunk last."""
    prompts = [[504, 3575, 282, 4649, 314], [19556, 905]]
    kwargs = dict(model=MODEL_NAME, prompt=prompts, max_tokens=10, temperature=0, n=2)
    whole = client.completions.create(**kwargs)
    texts, reasons, usage = {}, {}, None
    for chunk in client.completions.create(
        **kwargs, stream=True, stream_options={"include_usage": True}
    ):
        if chunk.usage is not None:
            assert not chunk.choices
            usage = chunk.usage
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
            if choice.finish_reason is not None:
                assert choice.index not in reasons, "a finish reason was sent twice"
                reasons[choice.index] = choice.finish_reason
    assert texts == {c.index: c.text for c in whole.choices}
    assert set(texts) == {0, 1, 2, 3}
    assert reasons == {i: "length" for i in range(4)}
    counts = {"prompt_tokens", "completion_tokens", "total_tokens"}  # cached_tokens may differ
    assert usage.model_dump(include=counts) == whole.usage.model_dump(include=counts)


def test_continuous_usage_counts_each_chunks_tokens_so_far(client: openai.OpenAI) -> None:
    """vLLM's continuous_usage_stats: each chunk carries its choice's usage so far."""
    options = {"include_usage": True, "continuous_usage_stats": True}
    chunks = list(
        client.completions.create(
            model=MODEL_NAME,
            prompt=PROMPTS[0],
            max_tokens=24,
            temperature=0,
            stream=True,
            stream_options=options,
            extra_body={"ignore_eos": True},
        )
    )
    assert chunks[0].system_fingerprint is None
    counts = [c.usage.completion_tokens for c in chunks[:-1]]
    assert counts == sorted(counts) and counts[-1] == 24 and counts[0] >= 1
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 24


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_every_chunk_of_a_stream_has_the_same_created(
    offline_llm: LLM, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """OpenAI: "Each chunk has the same timestamp", however long the stream takes (here
    the clock moves a second at each reading)."""
    clock = itertools.count(1_800_000_000)
    monkeypatch.setattr(time, "time", lambda: float(next(clock)))
    app = api_server.build_app(AsyncLLM(offline_llm.llm_engine), [MODEL_NAME])
    body = {"model": MODEL_NAME, "max_tokens": 6, "temperature": 0, "stream": True}
    body |= (
        {"prompt": "Hi"}
        if path == "/v1/completions"
        else {"messages": [{"role": "user", "content": "Hi"}]}
    )
    with TestClient(app) as http:
        lines = http.post(path, json=body).text.splitlines()
    chunks = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    assert len(chunks) >= 3 and len({c["created"] for c in chunks}) == 1


def test_logprobs_match_offline_llm(client: openai.OpenAI, offline_llm: LLM) -> None:
    response = client.completions.create(
        model=MODEL_NAME, prompt=PROMPTS[0], max_tokens=6, temperature=0, logprobs=3
    )
    (expected,) = offline(offline_llm, PROMPTS[0], max_tokens=6, temperature=0, logprobs=3)
    logprobs = response.choices[0].logprobs
    expected_lp = [
        step[t].logprob
        for t, step in zip(expected.outputs[0].token_ids, expected.outputs[0].logprobs)
    ]
    assert logprobs.token_logprobs == pytest.approx(expected_lp, abs=1e-4)
    assert "".join(logprobs.tokens) == response.choices[0].text
    assert logprobs.text_offset[0] == 0
    for token, top, lp in zip(logprobs.tokens, logprobs.top_logprobs, logprobs.token_logprobs):
        assert len(top) == 3  # greedy: the chosen token is the best, so it is in the top 3
        assert top[token] == pytest.approx(lp) and max(top.values()) == pytest.approx(lp)


@pytest.mark.parametrize("echo", [False, True])
def test_text_offsets_of_split_characters_are_the_same_streamed(
    client: openai.OpenAI, echo: bool
) -> None:
    """Tokens that are pieces of one CJK character start where it does: no offset passes
    the end of the text, and the stream's offsets are the whole answer's."""
    kwargs = dict(model=MODEL_NAME, prompt="中文：我喜欢", max_tokens=6, temperature=0)
    kwargs |= dict(logprobs=1, echo=echo)
    whole = client.completions.create(**kwargs).choices[0]
    streamed = [
        offset
        for chunk in client.completions.create(**kwargs, stream=True)
        for choice in chunk.choices
        for offset in (choice.logprobs.text_offset if choice.logprobs else [])
    ]
    assert streamed == whole.logprobs.text_offset
    assert max(streamed) <= len(whole.text) and streamed == sorted(streamed)


def test_echo_with_logprobs_returns_prompt_first(client: openai.OpenAI) -> None:
    response = client.completions.create(
        model=MODEL_NAME, prompt=PROMPTS[1], max_tokens=3, temperature=0, echo=True, logprobs=1
    )
    choice = response.choices[0]
    assert choice.text.startswith(PROMPTS[1])
    num_prompt = response.usage.prompt_tokens
    assert len(choice.logprobs.tokens) == num_prompt + 3
    assert choice.logprobs.token_logprobs[0] is None
    assert all(lp is not None for lp in choice.logprobs.token_logprobs[1:])


def test_echo_without_generation_scores_the_prompt(client: openai.OpenAI) -> None:
    """vLLM's echo with max_tokens 0: each choice is the prompt with its logprobs (the same
    as with a generated token), 0 completion tokens, "length"; streamed the same, n > 1
    too. max_tokens 0 without echo stays a 400."""
    kwargs = dict(model=MODEL_NAME, prompt=PROMPTS[2], temperature=0, echo=True, logprobs=1)
    scored = client.completions.create(**kwargs, max_tokens=0, n=2)
    generated = client.completions.create(**kwargs, max_tokens=1).choices[0].logprobs
    num_prompt = scored.usage.prompt_tokens
    assert scored.usage.completion_tokens == 0
    assert [c.index for c in scored.choices] == [0, 1]
    for choice in scored.choices:
        assert choice.text == PROMPTS[2] and choice.finish_reason == "length"
        assert choice.logprobs.tokens == generated.tokens[:num_prompt]
        assert choice.logprobs.token_logprobs == generated.token_logprobs[:num_prompt]
        assert choice.logprobs.text_offset == generated.text_offset[:num_prompt]
    chunks = list(
        client.completions.create(
            **kwargs, max_tokens=0, stream=True, stream_options={"include_usage": True}
        )
    )
    choices = [c for chunk in chunks for c in chunk.choices]
    assert "".join(c.text for c in choices) == PROMPTS[2]
    assert choices[-1].finish_reason == "length"
    assert choices[0].logprobs.token_logprobs == generated.token_logprobs[:num_prompt]
    assert chunks[-1].usage.completion_tokens == 0
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model=MODEL_NAME, prompt=PROMPTS[2], max_tokens=0)


def test_seed_reproducible_and_n_samples(client: openai.OpenAI) -> None:
    kwargs = dict(model=MODEL_NAME, prompt=PROMPTS[1], max_tokens=8, temperature=1.0, n=2)
    first = client.completions.create(**kwargs, seed=1234)
    again = client.completions.create(**kwargs, seed=1234)
    assert [c.text for c in first.choices] == [c.text for c in again.choices]
    assert [c.index for c in first.choices] == [0, 1]
    assert first.usage.completion_tokens == 16


def test_stop_string_ends_the_text(client: openai.OpenAI) -> None:
    kwargs = dict(model=MODEL_NAME, prompt=PROMPTS[2], max_tokens=12, temperature=0)
    text = client.completions.create(**kwargs).choices[0].text
    stop = text.strip()[2:5]
    choice = client.completions.create(**kwargs, stop=[stop]).choices[0]
    assert choice.text == text[: text.index(stop)]
    assert choice.finish_reason == "stop"
    assert choice.model_extra["stop_reason"] == stop


def test_truncate_prompt_tokens_keeps_the_prompts_end(
    client: openai.OpenAI, offline_llm: LLM
) -> None:
    """vLLM's truncate_prompt_tokens: the last N tokens (-1: up to max_model_len), the same
    answer as those tokens sent alone; chat cuts its templated prompt likewise."""
    ids = offline_llm.get_tokenizer().encode("One two three four five six seven eight")
    greedy = {"max_tokens": 4, "temperature": 0}
    cut = client.completions.create(
        model=MODEL_NAME, prompt=ids, extra_body={"truncate_prompt_tokens": 3}, **greedy
    )
    alone = client.completions.create(model=MODEL_NAME, prompt=ids[-3:], **greedy)
    assert cut.usage.prompt_tokens == 3 and cut.choices[0].text == alone.choices[0].text
    whole = client.completions.create(
        model=MODEL_NAME, prompt=ids, extra_body={"truncate_prompt_tokens": -1}, **greedy
    )
    assert whole.usage.prompt_tokens == len(ids)
    chat = client.chat.completions.create(
        model=MODEL_NAME,
        messages=[{"role": "user", "content": "Hello there"}],
        extra_body={"truncate_prompt_tokens": 5},
        **greedy,
    )
    assert chat.usage.prompt_tokens == 5
    with pytest.raises(openai.BadRequestError, match="truncate_prompt_tokens"):
        client.completions.create(
            model=MODEL_NAME, prompt=ids, extra_body={"truncate_prompt_tokens": 0}, **greedy
        )


# vLLM's output options: return_token_ids, return_tokens_as_token_ids, request_id.


def _post(http: TestClient, body: dict, headers: dict | None = None) -> dict | list[dict]:
    return post(http, "/v1/completions", body, headers)


@pytest.fixture
def http(offline_llm: LLM) -> Iterator[TestClient]:
    with TestClient(api_server.build_app(AsyncLLM(offline_llm.llm_engine), [MODEL_NAME])) as c:
        yield c


@pytest.mark.parametrize("echo", [False, True])
def test_return_token_ids_are_the_prompts_and_the_engines(
    http: TestClient, offline_llm: LLM, echo: bool
) -> None:
    """vLLM's return_token_ids: per choice the prompt's ids (the tokenizer's encoding) and
    the generated ids (offline LLM.generate's; with echo still only the generated ones),
    streamed: the prompt's once, in the choice's first chunk, and each chunk's new ids,
    which join to the whole answer's. Not asked: no such keys."""
    prompts = PROMPTS[:2]
    body = {"prompt": prompts, "max_tokens": 5, "temperature": 0, "n": 2, "echo": echo}
    whole = _post(http, body | {"return_token_ids": True})
    expected = offline(offline_llm, prompts, max_tokens=5, temperature=0)
    encode = offline_llm.get_tokenizer().encode
    for choice in whole["choices"]:
        i = choice["index"] // 2
        assert choice["prompt_token_ids"] == encode(prompts[i])
        assert choice["token_ids"] == list(expected[i].outputs[0].token_ids)
        assert choice["text"] == (prompts[i] if echo else "") + expected[i].outputs[0].text
    chunks = _post(http, body | {"return_token_ids": True, "stream": True})
    prompt_ids, ids = {}, {}
    for choice in (c for chunk in chunks for c in chunk["choices"]):
        if "prompt_token_ids" in choice:
            assert choice["index"] not in ids and choice["index"] not in prompt_ids
            prompt_ids[choice["index"]] = choice["prompt_token_ids"]
        ids[choice["index"]] = ids.get(choice["index"], []) + choice["token_ids"]
    assert prompt_ids == {c["index"]: c["prompt_token_ids"] for c in whole["choices"]}
    assert ids == {c["index"]: c["token_ids"] for c in whole["choices"]}
    plain = _post(http, body)["choices"] + _post(http, body | {"stream": True})[0]["choices"]
    assert not {"prompt_token_ids", "token_ids"} & {key for c in plain for key in c}


def test_return_tokens_as_token_ids_names_every_token_by_id(offline_llm: LLM) -> None:
    """vLLM's `token_id:<id>` names, the chosen tokens' and the alternatives'; the server's
    --return-tokens-as-token-ids makes them the default, which a request may turn off."""
    body = {"prompt": PROMPTS[0], "max_tokens": 4, "temperature": 0, "logprobs": 2}
    body |= {"return_token_ids": True}
    app = api_server.build_app(
        AsyncLLM(offline_llm.llm_engine), [MODEL_NAME], return_tokens_as_token_ids=True
    )
    with TestClient(app) as http:
        (by_default,) = _post(http, body)["choices"]
        (turned_off,) = _post(http, body | {"return_tokens_as_token_ids": False})["choices"]
        streamed = _post(http, body | {"stream": True})
    names = [f"token_id:{t}" for t in by_default["token_ids"]]
    assert by_default["logprobs"]["tokens"] == names
    for name, top in zip(names, by_default["logprobs"]["top_logprobs"]):
        assert name in top and all(key.startswith("token_id:") for key in top)
    assert [t for ch in streamed for c in ch["choices"] for t in c["logprobs"]["tokens"]] == names
    assert "".join(turned_off["logprobs"]["tokens"]) == turned_off["text"]


def test_request_id_in_the_body_is_the_ids_base_unless_a_header_gives_one(
    offline_llm: LLM,
) -> None:
    """vLLM's `request_id` field: `cmpl-<request_id>`; the X-Request-Id header wins, and
    with --enable-request-id-headers a header the server made up yields to the body's."""
    body = {"prompt": PROMPTS[0], "max_tokens": 1, "request_id": "from-body"}
    for headers_flag in (False, True):
        app = api_server.build_app(
            AsyncLLM(offline_llm.llm_engine), [MODEL_NAME], request_id_headers=headers_flag
        )
        with TestClient(app) as http:
            assert _post(http, body)["id"] == "cmpl-from-body"
            assert _post(http, body, {"X-Request-Id": "hdr"})["id"] == "cmpl-hdr"
            assert _post(http, body | {"stream": True})[0]["id"] == "cmpl-from-body"


# vLLM's cache_salt and priority, on a scripted model (scripted_model.py) with a small cache.


@pytest.fixture(scope="module")
def scripted_folder(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = str(tmp_path_factory.mktemp("scripted"))
    save_scripted_model(folder)
    return folder


def scripted_app(folder: str, policy: str = "fcfs") -> Iterator[TestClient]:
    return app_over(
        folder, MODEL_NAME, num_kv_blocks=32, max_model_len=64, scheduling_policy=policy
    )


def test_cache_salt_keeps_cached_blocks_to_its_own_requests(scripted_folder: str) -> None:
    """vLLM's cache_salt: a 40-token prompt's 2 full blocks come from the prefix cache only
    after a request of the same salt (none after none): usage's cached_tokens. A salt that
    is not a non-empty string is a 400 with vLLM's message."""
    body = {"prompt": [5] * 40, "max_tokens": 2, "temperature": 0}
    cached = []
    for http in scripted_app(scripted_folder):
        for salt in ["a", "a", "b", None, None]:
            salted = {} if salt is None else {"cache_salt": salt}
            usage = _post(http, body | salted)["usage"]
            cached.append(usage["prompt_tokens_details"]["cached_tokens"])
        for bad in ["", 5]:
            response = http.post("/v1/completions", json=body | {"cache_salt": bad})
            assert response.status_code == 400
            assert "Parameter 'cache_salt' must be a non-empty string" in response.text
    assert cached == [0, 32, 0, 0, 32]


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_priority_is_refused_unless_the_server_schedules_by_it(
    scripted_folder: str, policy: str
) -> None:
    """vLLM's rule: a nonzero priority needs --scheduling-policy priority; 0 always goes.
    Either way it is a signed 64-bit int (docs/limits.md); a 400 names it."""
    body = {"prompt": [5, 6], "max_tokens": 1}
    for http in scripted_app(scripted_folder, policy):
        assert http.post("/v1/completions", json=body | {"priority": 0}).status_code == 200
        response = http.post("/v1/completions", json=body | {"priority": -3})
        too_big = http.post("/v1/completions", json=body | {"priority": 2**63})
    assert too_big.status_code == 400 and too_big.json()["error"]["param"] == "priority"
    if policy == "priority":
        assert response.status_code == 200, response.text
    else:
        assert response.status_code == 400
        assert "Got priority -3 but priority scheduling is not enabled" in response.text
        assert response.json()["error"]["param"] == "priority"
