"""vLLM's classification API, POST /classify and /v1/classify
(pagedllm/entrypoints/openai/serving_classification.py). References: transformers'
`AutoModelForSequenceClassification` logits of the tokenizer's ids (tests/classifier_models.py)
and their softmax, the LM head's rows of a converted generative checkpoint, the config's
id2label, and vLLM's response shape (`label`, `probs`, `num_classes`, usage)."""

from collections.abc import Callable, Iterator

import pytest
import torch
import transformers
from fastapi.testclient import TestClient

from tests.classifier_models import hf_label_logits, save_tiny_classifier
from tests.embedding_models import embedding_folder, save_byte_tokenizer
from tests.entrypoints.openai.app_client import app_over

MODEL = "tiny-classifier"
LABELS = {0: "negative", 1: "neutral", 2: "positive"}
PATHS = ["/classify", "/v1/classify"]
TEXTS = ["hello", "a longer text that runs past one chunk of thirty-two tokens, twice"]


def app_client(folder: str, **kwargs: object) -> Iterator[TestClient]:
    yield from app_over(
        folder, MODEL, dtype="float32", num_kv_blocks=64, max_num_batched_tokens=32, **kwargs
    )


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A three-label classifier with named labels, its tokenizer adding <s> and </s> and
    holding a chat template."""
    folder = str(tmp_path_factory.mktemp("classify") / "model")
    label2id = {name: i for i, name in LABELS.items()}
    save_tiny_classifier("qwen3", folder, 3, id2label=LABELS, label2id=label2id)
    save_byte_tokenizer(folder, specials=True)
    return folder


@pytest.fixture(scope="module")
def http(folder: str) -> Iterator[TestClient]:
    yield from app_client(folder)


@pytest.fixture(scope="module")
def tokenizer(folder: str) -> transformers.PreTrainedTokenizerBase:
    return transformers.AutoTokenizer.from_pretrained(folder)


@pytest.fixture(scope="module")
def logits(folder: str) -> Callable[[list[int]], torch.Tensor]:
    """token ids -> transformers' label logits [3]."""
    return lambda ids: hf_label_logits(folder, [ids])[0]


def post(http: TestClient, path: str, body: dict) -> dict:
    response = http.post(path, json={"model": MODEL, **body})
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("path", PATHS)
def test_inputs_of_every_shape_equal_transformers_softmax(
    http: TestClient,
    tokenizer: transformers.PreTrainedTokenizerBase,
    logits: Callable[[list[int]], torch.Tensor],
    path: str,
) -> None:
    ids = [tokenizer.encode(text) for text in TEXTS]
    assert ids[0][0] == 1 and ids[0][-1] == 2  # the tokenizer's <s> and </s>
    for inputs, expected_ids in [(TEXTS[0], ids[:1]), (TEXTS, ids), (ids[1], ids[1:]), (ids, ids)]:
        body = post(http, path, {"input": inputs})
        assert body["id"].startswith("classify-") and body["object"] == "list"
        assert body["model"] == MODEL and isinstance(body["created"], int)
        num_tokens = sum(len(i) for i in expected_ids)
        assert body["usage"] == {
            "prompt_tokens": num_tokens,
            "total_tokens": num_tokens,
            "completion_tokens": 0,
            "prompt_tokens_details": None,
        }
        assert [d["index"] for d in body["data"]] == list(range(len(expected_ids)))
        for d, prompt in zip(body["data"], expected_ids, strict=True):
            expected = logits(prompt).softmax(-1)
            assert d["probs"] == pytest.approx(expected.tolist(), abs=1e-5)
            assert d["num_classes"] == 3
            assert d["label"] == LABELS[int(expected.argmax())]


def test_labels_name_the_best_of_each_prompt(http: TestClient) -> None:
    """The tiny classifier's prompts land on different labels, each named by id2label."""
    prompts = [[5 + i, 40 + 3 * i, 7] for i in range(12)]
    body = post(http, "/classify", {"input": prompts})
    labels = [d["label"] for d in body["data"]]
    assert labels == [LABELS[max(range(3), key=d["probs"].__getitem__)] for d in body["data"]]
    assert len(set(labels)) > 1


def test_use_activation_false_gives_the_raw_logits(
    http: TestClient, logits: Callable[[list[int]], torch.Tensor]
) -> None:
    ids = [5, 6, 7, 8]
    (raw,) = post(http, "/v1/classify", {"input": [ids], "use_activation": False})["data"]
    assert raw["probs"] == pytest.approx(logits(ids).tolist(), abs=1e-5)
    assert raw["label"] == LABELS[int(logits(ids).argmax())]
    (on,) = post(http, "/v1/classify", {"input": [ids], "use_activation": True})["data"]
    assert on["probs"] == pytest.approx(logits(ids).softmax(-1).tolist(), abs=1e-5)


@pytest.mark.parametrize(
    ("body", "specials"),
    [({}, False), ({"add_special_tokens": True}, True), ({"add_generation_prompt": True}, False)],
)
def test_messages_are_one_prompt_through_the_chat_template(
    http: TestClient,
    tokenizer: transformers.PreTrainedTokenizerBase,
    logits: Callable[[list[int]], torch.Tensor],
    body: dict,
    specials: bool,
) -> None:
    """As /v1/embeddings' messages: no special tokens beyond the template's by default."""
    messages = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]
    prompted = body.get("add_generation_prompt", False)
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompted)
    ids = tokenizer.encode(text, add_special_tokens=specials)
    answer = post(http, "/classify", {"messages": messages} | body)
    (d,) = answer["data"]
    assert d["probs"] == pytest.approx(logits(ids).softmax(-1).tolist(), abs=1e-5)
    assert answer["usage"]["prompt_tokens"] == len(ids)


def test_the_servers_chat_template_renders_messages(
    folder: str,
    tokenizer: transformers.PreTrainedTokenizerBase,
    logits: Callable[[list[int]], torch.Tensor],
) -> None:
    template = "{% for m in messages %}<{{ m['content'] }}>{% endfor %}"
    for http in app_client(folder, chat_template=template):
        body = post(http, "/classify", {"messages": [{"role": "user", "content": "hey"}]})
    ids = tokenizer.encode("<hey>", add_special_tokens=False)
    assert body["data"][0]["probs"] == pytest.approx(logits(ids).softmax(-1).tolist(), abs=1e-5)


def test_truncation_and_special_tokens(
    http: TestClient,
    tokenizer: transformers.PreTrainedTokenizerBase,
    logits: Callable[[list[int]], torch.Tensor],
) -> None:
    cut = post(http, "/classify", {"input": TEXTS[1], "truncate_prompt_tokens": 3})
    last = tokenizer.encode(TEXTS[1])[-3:]
    assert cut["usage"]["prompt_tokens"] == 3
    assert cut["data"][0]["probs"] == pytest.approx(logits(last).softmax(-1).tolist(), abs=1e-5)
    bare = post(http, "/classify", {"input": "hi", "add_special_tokens": False})
    ids = tokenizer.encode("hi", add_special_tokens=False)
    assert bare["usage"]["prompt_tokens"] == len(ids) == 2
    assert bare["data"][0]["probs"] == pytest.approx(logits(ids).softmax(-1).tolist(), abs=1e-5)


def test_a_converted_checkpoint_without_labels_answers_label_null(
    tiny_model_path: Callable[[str], str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A generative checkpoint as a classifier over two tokens' LM-head rows (vLLM's
    classifier_from_token, no_post_processing): its labels have no names. Reference:
    transformers' next-token logits of those tokens, softmaxed."""
    target = str(tmp_path_factory.mktemp("from-token") / "model")
    folder = embedding_folder(tiny_model_path("qwen3"), target)
    overrides = {
        "architectures": ["Qwen3ForSequenceClassification"],
        "classifier_from_token": ["a", "b"],
        "method": "no_post_processing",
    }
    for http in app_client(folder, hf_overrides=overrides):
        (d,) = post(http, "/classify", {"input": "hello"})["data"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        next_token = hf(torch.tensor([tokenizer.encode("hello")])).logits[0, -1]
    expected = next_token[tokenizer.convert_tokens_to_ids(["a", "b"])].softmax(-1)
    assert d["label"] is None and d["num_classes"] == 2
    assert d["probs"] == pytest.approx(expected.tolist(), abs=1e-5)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": ""}, "input"),
        ({"input": []}, "input"),
        ({"input": "hi", "messages": [{"role": "user", "content": "hi"}]}, "input"),
        ({}, "input"),
        ({"messages": []}, "messages"),
        ({"input": [[5, 999]]}, "input"),
        ({"input": "x" * 600}, "input"),
        ({"messages": [{"role": "user", "content": "x" * 600}]}, "messages"),
        ({"input": "hi", "truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
        ({"input": "hi", "truncate_prompt_tokens": -2}, "truncate_prompt_tokens"),
        ({"input": "hi", "use_activation": "sometimes"}, "use_activation"),
        ({"input": "hi", "softmax": False}, "softmax"),
        ({"input": "hi", "activation": True}, "activation"),
        ({"input": "hi", "priority": 1}, "priority"),
        ({"input": "hi", "request_id": "mine"}, "request_id"),
        ({"input": "hi", "chat_template": "{{ 1 }}"}, "chat_template"),
        ({"input": "hi", "mm_processor_kwargs": {"a": 1}}, "mm_processor_kwargs"),
    ],
)
def test_bad_requests_get_400_naming_the_field(http: TestClient, body: dict, param: str) -> None:
    response = http.post("/classify", json={"model": MODEL, **body})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param, response.json()


def test_unknown_model_gets_404(http: TestClient) -> None:
    response = http.post("/v1/classify", json={"model": "other", "input": "hi"})
    assert response.status_code == 404
    assert "other" in response.json()["error"]["message"]


def test_request_id_header_names_the_answer(http: TestClient) -> None:
    response = http.post("/classify", json={"input": "a"}, headers={"X-Request-Id": "abc"})
    assert response.json()["id"] == "classify-abc"


def test_a_classifier_server_refuses_embeddings_and_generation(http: TestClient) -> None:
    """vLLM's: the model does not support the Embeddings API; generating routes point to
    the routes a classifier serves."""
    response = http.post("/v1/embeddings", json={"model": MODEL, "input": "hi"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "model"
    assert "does not support the Embeddings API" in error["message"]
    assert "a classifier" in error["message"] and "/classify" in error["message"]
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
    response = http.post("/v1/completions", json=body)
    assert response.status_code == 400
    assert "pooling model" in response.json()["error"]["message"]
    assert "/classify" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("runner", "reason"), [("generate", "this server generates"), ("pooling", "embedding model")]
)
def test_generating_and_embedding_servers_refuse_classification(
    tiny_model_path: Callable[[str], str],
    tmp_path_factory: pytest.TempPathFactory,
    runner: str,
    reason: str,
) -> None:
    target = str(tmp_path_factory.mktemp("not-a-classifier") / "model")
    folder = embedding_folder(tiny_model_path("llama-gqa-llama3"), target)
    for http in app_client(folder, runner=runner):
        response = http.post("/classify", json={"model": MODEL, "input": "hi"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "model"
    assert "does not support the Classification API" in error["message"]
    assert reason in error["message"]


def test_openapi_schema_describes_both_paths(http: TestClient) -> None:
    schema = http.get("/openapi.json").json()
    for path in PATHS:
        assert "requestBody" in schema["paths"][path]["post"]
        assert "400" in schema["paths"][path]["post"]["responses"]
    for name in ("ClassificationRequest", "ClassificationResponse"):
        assert name in schema["components"]["schemas"]
