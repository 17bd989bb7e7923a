"""vLLM's generic pooling API, POST /pooling
(pagedllm/entrypoints/openai/serving_pooling.py). References: transformers'
AutoModelForTokenClassification logits of the tokenizer's ids and their softmax (vLLM's
default token_classify activation), the same server's /v1/embeddings and /classify answers
for the same inputs (the pooler's raw output is theirs), the float answer for base64
(little-endian float32 bytes), vLLM's response shape (`data` per input, `object`
"pooling", usage), and --api-key guarding the route."""

import base64
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import torch
import transformers
from fastapi.testclient import TestClient

from pagedllm import LLM
from pagedllm.engine.async_llm import AsyncLLM
from pagedllm.entrypoints.openai import api_server
from tests.classifier_models import (
    hf_token_logits,
    save_tiny_classifier,
    save_tiny_token_classifier,
)
from tests.embedding_models import embedding_folder
from tests.entrypoints.openai.app_client import app_over

MODEL = "tiny-pool"
TEXTS = ["hello", "a longer text that runs past one chunk of thirty-two tokens, twice"]


def app_client(folder: str, **kwargs: object) -> Iterator[TestClient]:
    yield from app_over(
        folder, MODEL, dtype="float32", num_kv_blocks=64, max_num_batched_tokens=32, **kwargs
    )


def post(http: TestClient, body: dict, path: str = "/pooling") -> dict:
    response = http.post(path, json={"model": MODEL, **body})
    assert response.status_code == 200, response.text
    return response.json()


def refusal(http: TestClient, body: dict) -> dict:
    """The error of a request that must be a 400."""
    response = http.post("/pooling", json={"model": MODEL, **body})
    assert response.status_code == 400, response.text
    return response.json()["error"]


@pytest.fixture(scope="module")
def token_folder(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = str(tmp_path_factory.mktemp("token_classify") / "model")
    return save_tiny_token_classifier("qwen2", folder, 4)


@pytest.fixture(scope="module")
def token_http(token_folder: str) -> Iterator[TestClient]:
    yield from app_client(token_folder)


@pytest.fixture(scope="module")
def logits(token_folder: str) -> Callable[[list[int]], torch.Tensor]:
    """token ids -> transformers' per-token logits [num_tokens, 4]."""
    return lambda ids: hf_token_logits(token_folder, [ids])[0]


def test_token_classification_per_token_equals_transformers(
    token_http: TestClient, token_folder: str, logits: Callable[[list[int]], torch.Tensor]
) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(token_folder)
    ids = [tokenizer.encode(text) for text in TEXTS]
    for inputs, expected_ids in [(TEXTS[0], ids[:1]), (TEXTS, ids), (ids[1], ids[1:])]:
        body = post(token_http, {"input": inputs})
        assert body["id"].startswith("pool-") and body["object"] == "list"
        assert body["model"] == MODEL and isinstance(body["created"], int)
        num_tokens = sum(len(i) for i in expected_ids)
        assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] == num_tokens
        assert [d["index"] for d in body["data"]] == list(range(len(expected_ids)))
        for item, prompt in zip(body["data"], expected_ids):
            assert item["object"] == "pooling"
            got = torch.tensor(item["data"])
            torch.testing.assert_close(got, logits(prompt).softmax(-1), atol=1e-4, rtol=0)
    raw = post(token_http, {"input": ids[1], "use_activation": False, "task": "token_classify"})
    got = torch.tensor(raw["data"][0]["data"])
    torch.testing.assert_close(got, logits(ids[1]), atol=1e-4, rtol=0)


def test_base64_is_the_float_answers_bytes(token_http: TestClient) -> None:
    floats = post(token_http, {"input": TEXTS[1]})["data"][0]["data"]
    encoded = post(token_http, {"input": TEXTS[1], "encoding_format": "base64"})
    raw = np.frombuffer(base64.b64decode(encoded["data"][0]["data"]), dtype="<f4")
    assert raw.tolist() == np.asarray(floats, dtype=np.float32).flatten().tolist()


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({"input": "hi", "task": "bogus"}, "task", "task 'bogus': use one of"),
        ({"input": "hi", "task": "embed"}, "task", "this model's pooling tasks are token_classify"),
        ({"input": "hi", "dimensions": 2}, "dimensions", "dimensions is for embeddings"),
        ({"input": []}, "input", "input must not be an empty list"),
        ({"input": [[1, 2], [10**9]]}, "input", None),
    ],
)
def test_bad_requests_are_400s_naming_the_field(
    token_http: TestClient, body: dict, param: str, message: str | None
) -> None:
    error = refusal(token_http, body)
    assert error["param"] == param
    if message is not None:
        assert message in error["message"]


def test_an_embedding_model_pools_its_embeddings(
    tiny_model_path: Callable[[str], str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The same numbers as /v1/embeddings; a generating server of the same model refuses."""
    folder = embedding_folder(
        tiny_model_path("llama-gqa-llama3"), str(tmp_path_factory.mktemp("embed") / "model")
    )
    for http in app_client(folder, runner="pooling"):
        embeddings = post(http, {"input": TEXTS}, "/v1/embeddings")["data"]
        pooled = post(http, {"input": TEXTS, "task": "embed"})["data"]
        assert [p["data"] for p in pooled] == [e["embedding"] for e in embeddings]
        unnormalized = post(http, {"input": TEXTS[0], "normalize": False})["data"][0]["data"]
        assert abs(float(np.linalg.norm(unnormalized)) - 1) > 1e-3
        error = refusal(http, {"input": "hi", "task": "classify"})
        assert "pooling tasks are embed, score" in error["message"]
    for http in app_client(folder, runner="generate"):
        error = refusal(http, {"input": "hi"})
        assert error["param"] == "model" and "this server generates" in error["message"]


def test_a_classifier_pools_its_label_scores(tmp_path_factory: pytest.TempPathFactory) -> None:
    folder = save_tiny_classifier("qwen3", str(tmp_path_factory.mktemp("cls") / "model"), 3)
    for http in app_client(folder):
        classified = post(http, {"input": TEXTS}, "/classify")["data"]
        pooled = post(http, {"input": TEXTS})["data"]
        assert [p["data"] for p in pooled] == [c["probs"] for c in classified]


def test_the_api_key_guards_pooling(token_folder: str) -> None:
    """--api-key guards /pooling as it guards the /v1 routes."""
    with LLM(token_folder, dtype="float32", num_kv_blocks=64) as llm:
        app = api_server.build_app(AsyncLLM(llm.llm_engine), [MODEL], api_key=["secret"])
        with TestClient(app) as http:
            body = {"model": MODEL, "input": "hi"}
            refused = http.post("/pooling", json=body)
            assert refused.status_code == 401
            assert refused.json()["error"]["code"] == "invalid_api_key"
            keyed = http.post("/pooling", json=body, headers={"Authorization": "Bearer secret"})
            assert keyed.status_code == 200, keyed.text
