"""POST /v1/chat/completions through the official `openai` client. Reference: the offline
`LLM.chat` (the tokenizer's chat template, then generate) on the same model."""

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

MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name three colours."},
]


def test_greedy_matches_offline_llm_chat(client: openai.OpenAI, offline_llm: LLM) -> None:
    response = client.chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, max_completion_tokens=12, temperature=0
    )
    (expected,) = offline_llm.chat(
        MESSAGES, SamplingParams(max_tokens=12, temperature=0), use_tqdm=False
    )
    choice = response.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == expected.outputs[0].text
    assert response.object == "chat.completion"
    assert response.usage.prompt_tokens == len(expected.prompt_token_ids)
    assert response.usage.completion_tokens == len(expected.outputs[0].token_ids)


def test_stream_with_logprobs_equals_the_whole_answer(client: openai.OpenAI) -> None:
    kwargs = dict(model=MODEL_NAME, messages=MESSAGES, max_tokens=8, temperature=0, logprobs=True)
    whole = client.chat.completions.create(**kwargs, top_logprobs=2)
    chunks = list(
        client.chat.completions.create(
            **kwargs, top_logprobs=2, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.choices[0].delta.role is None for c in chunks[1:-1])
    content = "".join(c.choices[0].delta.content for c in chunks[:-1])
    assert content == whole.choices[0].message.content
    streamed = [lp for c in chunks[:-1] for lp in c.choices[0].logprobs.content]
    expected = whole.choices[0].logprobs.content
    assert [lp.token for lp in streamed] == [lp.token for lp in expected]
    assert [lp.logprob for lp in streamed] == pytest.approx([lp.logprob for lp in expected])
    assert len(expected) == whole.usage.completion_tokens == 8
    for lp in expected:
        assert len(lp.top_logprobs) == 2
        assert lp.top_logprobs[0].token == lp.token  # greedy picks the best
        assert bytes(lp.bytes).decode() == lp.token
    counts = {"prompt_tokens", "completion_tokens", "total_tokens"}  # cached_tokens may differ
    assert chunks[-1].choices == []
    assert chunks[-1].usage.model_dump(include=counts) == whole.usage.model_dump(include=counts)


def test_logprob_bytes_join_to_the_content(client: openai.OpenAI) -> None:
    """OpenAI's `bytes`: each token's own UTF-8 bytes, which joined give the content even
    where a character is split over tokens (Japanese, an emoji)."""
    messages = [{"role": "user", "content": "Say hi in Japanese and add an emoji."}]
    choice = client.chat.completions.create(
        model=MODEL_NAME, messages=messages, max_tokens=12, temperature=0, logprobs=True
    ).choices[0]
    joined = b"".join(bytes(entry.bytes) for entry in choice.logprobs.content)
    assert joined.decode() == choice.message.content
    assert any(entry.token == "\ufffd" for entry in choice.logprobs.content)


def test_continuous_usage_counts_each_choices_tokens(client: openai.OpenAI) -> None:
    options = {"include_usage": True, "continuous_usage_stats": True}
    kwargs = dict(model=MODEL_NAME, messages=MESSAGES, max_tokens=12, temperature=1.0, n=2)
    chunks = list(client.chat.completions.create(**kwargs, stream=True, stream_options=options))
    seen: dict[int, int] = {}
    for chunk in chunks[:-1]:
        (choice,) = chunk.choices
        assert chunk.usage.completion_tokens >= seen.get(choice.index, 0)
        seen[choice.index] = chunk.usage.completion_tokens
    assert sum(seen.values()) == chunks[-1].usage.completion_tokens
    assert len({c.created for c in chunks}) == 1


def test_n_seed_and_stop(client: openai.OpenAI) -> None:
    kwargs = dict(model=MODEL_NAME, messages=MESSAGES, max_tokens=10, temperature=1.0, n=2)
    first = client.chat.completions.create(**kwargs, seed=7)
    again = client.chat.completions.create(**kwargs, seed=7)
    assert [c.message.content for c in first.choices] == [c.message.content for c in again.choices]
    assert [c.index for c in first.choices] == [0, 1]
    greedy = dict(model=MODEL_NAME, messages=MESSAGES, max_tokens=10, temperature=0)
    text = client.chat.completions.create(**greedy).choices[0].message.content
    stop = text[3:6]
    stopped = client.chat.completions.create(**greedy, stop=stop).choices[0]
    assert stopped.message.content == text[: text.index(stop)]
    assert stopped.finish_reason == "stop"


# vLLM's output options: return_token_ids, return_tokens_as_token_ids, request_id.


def post_chat(http: TestClient, body: dict, headers: dict | None = None) -> dict | list[dict]:
    return post(http, "/v1/chat/completions", body, headers)


@pytest.fixture
def http(offline_llm: LLM) -> Iterator[TestClient]:
    with TestClient(api_server.build_app(AsyncLLM(offline_llm.llm_engine), [MODEL_NAME])) as c:
        yield c


def test_return_token_ids_are_the_prompts_and_the_engines(
    http: TestClient, offline_llm: LLM
) -> None:
    """vLLM's return_token_ids on chat: the templated prompt's ids at the answer's root
    (offline LLM.chat's), each choice's generated ids; streamed, the prompt's in the first
    chunk only and each chunk's new ids, which join to the whole answer's. Not asked: no
    such keys."""
    body = {"messages": MESSAGES, "max_tokens": 6, "temperature": 0, "n": 2}
    (expected,) = offline_llm.chat(
        MESSAGES, SamplingParams(max_tokens=6, temperature=0), use_tqdm=False
    )
    whole = post_chat(http, body | {"return_token_ids": True})
    assert whole["prompt_token_ids"] == list(expected.prompt_token_ids)
    for choice in whole["choices"]:
        assert choice["token_ids"] == list(expected.outputs[0].token_ids)
    chunks = post_chat(http, body | {"return_token_ids": True, "stream": True})
    assert chunks[0]["prompt_token_ids"] == whole["prompt_token_ids"]
    assert all("prompt_token_ids" not in chunk for chunk in chunks[1:])
    ids: dict[int, list[int]] = {}
    for choice in (c for chunk in chunks for c in chunk["choices"]):
        ids[choice["index"]] = ids.get(choice["index"], []) + choice["token_ids"]
    assert ids == {c["index"]: c["token_ids"] for c in whole["choices"]}
    plain = post_chat(http, body)
    chunk = post_chat(http, body | {"stream": True})[0]
    assert "prompt_token_ids" not in plain and "prompt_token_ids" not in chunk
    assert not {"token_ids"} & {k for c in plain["choices"] + chunk["choices"] for k in c}


def test_return_tokens_as_token_ids_in_chat_logprobs(http: TestClient) -> None:
    """vLLM's `token_id:<id>` names for the chosen tokens and the top alternatives; the
    bytes stay each token's own, which joined give the content."""
    body = {"messages": MESSAGES, "max_tokens": 6, "temperature": 0, "logprobs": True}
    body |= {"top_logprobs": 2, "return_token_ids": True, "return_tokens_as_token_ids": True}
    (choice,) = post_chat(http, body)["choices"]
    content = choice["logprobs"]["content"]
    assert [e["token"] for e in content] == [f"token_id:{t}" for t in choice["token_ids"]]
    assert all(e["top_logprobs"][0]["token"] == e["token"] for e in content)  # greedy
    assert all(t["token"].startswith("token_id:") for e in content for t in e["top_logprobs"])
    joined = b"".join(bytes(e["bytes"]) for e in content)
    assert joined.decode() == choice["message"]["content"]


def test_request_id_in_the_body_is_the_ids_base_unless_a_header_gives_one(
    http: TestClient,
) -> None:
    body = {"messages": MESSAGES, "max_tokens": 1, "request_id": "from-body"}
    assert post_chat(http, body)["id"] == "chatcmpl-from-body"
    assert post_chat(http, body | {"stream": True})[0]["id"] == "chatcmpl-from-body"
    assert post_chat(http, body, {"X-Request-Id": "hdr"})["id"] == "chatcmpl-hdr"


def test_the_answers_role_is_response_role_or_the_last_messages(offline_llm: LLM) -> None:
    """vLLM's rule: --response-role where add_generation_prompt is true (the default),
    else the last message's role (the answer continues it); whole and streamed."""
    app = api_server.build_app(AsyncLLM(offline_llm.llm_engine), [MODEL_NAME], response_role="bot")
    answer = [{"role": "assistant", "content": "Paris is"}]
    bodies = {
        "bot": {"messages": MESSAGES},
        "user": {"messages": MESSAGES, "add_generation_prompt": False},
        "assistant": {
            "messages": MESSAGES + answer,
            "add_generation_prompt": False,
            "continue_final_message": True,
        },
    }
    with TestClient(app) as http:
        for role, body in bodies.items():
            body |= {"max_tokens": 2, "temperature": 0}
            assert post_chat(http, body)["choices"][0]["message"]["role"] == role
            chunks = post_chat(http, body | {"stream": True})
            assert chunks[0]["choices"][0]["delta"]["role"] == role
            assert all(
                "role" not in c["delta"] or c["delta"]["role"] is None
                for chunk in chunks[1:]
                for c in chunk["choices"]
            )


def test_cache_salt_and_priority_reach_the_engine(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's cache_salt and priority on chat and on responses (which run through chat):
    the engine gets them (the prompt's `cache_salt`, generate's `priority`), and a
    templated prompt's 2 full blocks of 16 tokens are cached for its salt only."""
    save_scripted_model(str(tmp_path))
    seen = []
    generate = AsyncLLM.generate

    def spy(self, prompt: dict, params: object, request_id: str, priority: int = 0, **kwargs):
        seen.append((prompt.get("cache_salt"), priority))
        return generate(self, prompt, params, request_id, priority, **kwargs)

    monkeypatch.setattr(AsyncLLM, "generate", spy)
    words = " ".join(["w"] * 40)
    chat = {"messages": [{"role": "user", "content": words}], "max_tokens": 1}
    engine = dict(num_kv_blocks=32, max_model_len=64, scheduling_policy="priority")
    cached = []
    for http in app_over(str(tmp_path), MODEL_NAME, **engine):
        for salt in ["a", "a", "b"]:
            usage = post_chat(http, chat | {"cache_salt": salt, "priority": 2})["usage"]
            cached.append(usage["prompt_tokens_details"]["cached_tokens"])
        body = {"input": words, "cache_salt": "a", "priority": -1, "max_output_tokens": 1}
        post(http, "/v1/responses", body)
    assert cached == [0, 32, 0]
    assert seen == [("a", 2), ("a", 2), ("b", 2), ("a", -1)]
