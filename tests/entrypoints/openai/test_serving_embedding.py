"""POST /v1/embeddings (pagedllm/entrypoints/openai/serving_embedding.py) through the
official `openai` client. References: transformers' pooled hidden states of the tiny
checkpoint (tests/embedding_models.py), the tokenizer, the float answer for base64 (the
little-endian float32 bytes OpenAI sends), and OpenAI's response shapes."""

import base64
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import openai
import pytest
import torch
import transformers
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from tests.embedding_models import embedding_folder, hf_embedding
from tests.entrypoints.openai.app_client import app_over

MODEL = "tiny-embed"


@pytest.fixture(scope="module")
def folder(tiny_model_path: Callable[[str], str], tmp_path_factory: pytest.TempPathFactory) -> str:
    target = tmp_path_factory.mktemp("embed")
    source = tiny_model_path("llama-gqa-llama3")
    return embedding_folder(source, str(target / "model"), specials=True)


def app_client(folder: str, **kwargs: object) -> Iterator[TestClient]:
    yield from app_over(
        folder, MODEL, dtype="float32", num_kv_blocks=64, max_num_batched_tokens=32, **kwargs
    )


@pytest.fixture(scope="module")
def http(folder: str) -> Iterator[TestClient]:
    yield from app_client(folder, runner="pooling")


@pytest.fixture(scope="module")
def client(http: TestClient) -> openai.OpenAI:
    return openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=http)


@pytest.fixture(scope="module")
def hf(folder: str) -> torch.nn.Module:
    return transformers.AutoModel.from_pretrained(folder, dtype=torch.float32).eval()


def test_inputs_of_every_shape_equal_transformers(
    client: openai.OpenAI, hf: torch.nn.Module, folder: str
) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    texts = ["hello", "a longer text that runs past one chunk of thirty-two tokens, twice"]
    ids = [tokenizer.encode(t) for t in texts]
    for inputs, expected_ids in [
        (texts[0], ids[:1]),
        (texts, ids),
        (ids[1], ids[1:]),
        (ids, ids),
    ]:
        response = client.embeddings.create(model=MODEL, input=inputs)
        assert response.object == "list" and response.model == MODEL
        assert [d.index for d in response.data] == list(range(len(expected_ids)))
        assert all(d.object == "embedding" for d in response.data)
        num_tokens = sum(len(i) for i in expected_ids)
        assert response.usage.prompt_tokens == response.usage.total_tokens == num_tokens
        for d, prompt in zip(response.data, expected_ids, strict=True):
            expected = hf_embedding(hf, prompt, "LAST")
            assert torch.tensor(d.embedding) == pytest.approx(expected, abs=1e-5)


def test_dimensions_truncate_then_normalise(client: openai.OpenAI, hf: torch.nn.Module) -> None:
    ids = [5, 6, 7, 8]
    response = client.embeddings.create(model=MODEL, input=[ids], dimensions=16)
    (embedding,) = [d.embedding for d in response.data]
    assert len(embedding) == 16
    raw = hf_embedding(hf, ids, "LAST", normalize=False)
    expected = torch.nn.functional.normalize(raw[:16], dim=-1)
    assert torch.tensor(embedding) == pytest.approx(expected, abs=1e-5)
    assert float(np.linalg.norm(embedding)) == pytest.approx(1.0, abs=1e-5)


def test_base64_is_the_float_answer_as_little_endian_float32(client: openai.OpenAI) -> None:
    inputs = ["one", "two words"]
    floats = client.embeddings.create(model=MODEL, input=inputs, encoding_format="float")
    # The client decodes base64 itself when it asks for floats; ask for the raw body.
    raw = client.embeddings.with_raw_response.create(
        model=MODEL, input=inputs, encoding_format="base64"
    ).http_response.json()
    for item, expected in zip(raw["data"], floats.data, strict=True):
        decoded = np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4")
        assert decoded.tolist() == pytest.approx(expected.embedding, abs=0)
    # And the client's own decoding of base64 (its default format) gives the same floats.
    default = client.embeddings.create(model=MODEL, input=inputs)
    assert [d.embedding for d in default.data] == [d.embedding for d in floats.data]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": []}, "input"),
        ({"input": ""}, "input"),
        ({"input": [[5, 999]]}, "input"),
        ({"input": [[]]}, "input"),
        ({"input": [[-1]]}, "input"),
        ({"input": [1, "a"]}, "input"),
        ({"input": ["a", [1]]}, "input"),
        ({"input": [1.5]}, "input"),
        ({"input": [list(range(3, 300)) * 2]}, "input"),
        ({"input": "hi", "dimensions": 0}, "dimensions"),
        ({"input": "hi", "dimensions": 65}, "dimensions"),
        ({"input": "hi", "encoding_format": "int8"}, "encoding_format"),
        ({"input": ["a", ""]}, "input"),
        ({"input": "hi", "truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
        ({"input": "hi", "truncate_prompt_tokens": -2}, "truncate_prompt_tokens"),
        ({"input": "hi", "messages": [{"role": "user", "content": "hi"}]}, "input"),
        ({}, "input"),
        ({"messages": []}, "messages"),
        ({"input": "hi", "priority": 3}, "priority"),
    ],
)
def test_bad_requests_get_400_naming_the_field(http: TestClient, body: dict, param: str) -> None:
    response = http.post("/v1/embeddings", json={"model": MODEL, **body})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_truncation_and_special_tokens_as_vllm(
    client: openai.OpenAI, hf: torch.nn.Module, folder: str
) -> None:
    """`truncate_prompt_tokens` keeps each input's last N tokens (-1: up to the context
    length); `add_special_tokens: false` leaves the tokenizer's <s> ... </s> out."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    text = "a text of some length"
    ids = tokenizer.encode(text)
    assert ids[0] == 1 and ids[-1] == 2, "the tokenizer adds its special tokens"
    for body, expected_ids in [
        ({"truncate_prompt_tokens": 5}, ids[-5:]),
        ({"truncate_prompt_tokens": -1}, ids),
        ({"add_special_tokens": False}, ids[1:-1]),
    ]:
        response = client.embeddings.create(model=MODEL, input=text, extra_body=body)
        assert response.usage.prompt_tokens == len(expected_ids)
        expected = hf_embedding(hf, expected_ids, "LAST")
        assert torch.tensor(response.data[0].embedding) == pytest.approx(expected, abs=1e-5)
    long_ids = list(range(3, 300)) * 2
    response = client.embeddings.create(
        model=MODEL, input=[long_ids], extra_body={"truncate_prompt_tokens": -1}
    )
    assert response.usage.prompt_tokens == 512, "cut to the context length"


def test_messages_are_one_input_through_the_chat_template(
    client: openai.OpenAI, hf: torch.nn.Module, folder: str
) -> None:
    """vLLM's chat form: the conversation through the chat template, without the generation
    prompt unless asked (the template places any special tokens; `add_special_tokens: true`
    adds the tokenizer's on top)."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    messages = [{"role": "user", "content": "hello"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    prompted = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    for body, expected_ids in [
        ({}, tokenizer.encode(text, add_special_tokens=False)),
        ({"add_special_tokens": True}, tokenizer.encode(text)),
        ({"add_generation_prompt": True}, tokenizer.encode(prompted, add_special_tokens=False)),
    ]:
        response = client.embeddings.create(
            model=MODEL, input=[], extra_body={"messages": messages, "input": None} | body
        )
        assert response.usage.prompt_tokens == len(expected_ids)
        expected = hf_embedding(hf, expected_ids, "LAST")
        assert torch.tensor(response.data[0].embedding) == pytest.approx(expected, abs=1e-5)


def test_unknown_model_gets_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="other", input="hi")


def test_dimensions_refused_on_a_model_not_trained_for_them(
    tiny_model_path: Callable[[str], str], tmp_path: Path
) -> None:
    plain = embedding_folder(tiny_model_path("qwen3"), str(tmp_path / "m"), matryoshka=False)
    for http in app_client(plain, runner="pooling"):
        response = http.post("/v1/embeddings", json={"input": "hi", "dimensions": 8})
        assert response.status_code == 400
        assert "Matryoshka" in response.json()["error"]["message"]


def test_a_generating_server_refuses_embeddings_as_vllm(folder: str) -> None:
    for http in app_client(folder, runner="generate"):
        response = http.post("/v1/embeddings", json={"model": MODEL, "input": "hi"})
        assert response.status_code == 400
        assert "does not support the Embeddings API" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"prompt": "hi", "max_tokens": 2}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/responses", {"input": "hi"}),
        ("/v1/responses", {"input": "hi", "background": True}),
        ("/v1/responses", {"input": "hi", "background": True, "stream": True}),
    ],
)
def test_a_pooling_server_refuses_to_generate(http: TestClient, path: str, body: dict) -> None:
    """Before anything is queued: a background response is refused, not stored `failed`."""
    response = http.post(path, json={"model": MODEL} | body)
    assert response.status_code == 400
    assert "pooling model" in response.json()["error"]["message"]


def test_metrics_count_embedding_requests(client: openai.OpenAI, http: TestClient) -> None:
    """Each input is one pooling request in /metrics: its success ("stop"), its prompt
    tokens and its e2e latency."""

    def values() -> dict[str, float]:
        families = text_string_to_metric_families(http.get("/metrics").text)
        samples = [s for f in families for s in f.samples]
        return {
            name: sum(s.value for s in samples if s.name == name)
            for name in (
                "vllm:request_success_total",
                "vllm:request_prompt_tokens_sum",
                "vllm:e2e_request_latency_seconds_count",
                "vllm:request_queue_time_seconds_count",
                "vllm:prompt_tokens_total",
            )
        }

    before = values()
    client.embeddings.create(model=MODEL, input=[[5, 6, 7], [8, 9]])
    after = values()
    assert {name: after[name] - before[name] for name in after} == {
        "vllm:request_success_total": 2,
        "vllm:request_prompt_tokens_sum": 5,
        "vllm:e2e_request_latency_seconds_count": 2,
        "vllm:request_queue_time_seconds_count": 2,
        "vllm:prompt_tokens_total": 5,
    }
