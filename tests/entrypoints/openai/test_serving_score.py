"""vLLM's score and rerank APIs (pagedllm/entrypoints/openai/serving_score.py). References:
on an embedding model, the cosine similarity, computed here, of transformers' pooled
hidden states (tests/embedding_models.py) of the tokenizer's ids; on a cross-encoder (a
one-label classifier), transformers' sequence-classification logit of each pair's ids, its
sigmoid (tests/classifier_models.py); vLLM's pairing (1:N, N:N), its usage count (each
pair's ids, with the pad token between them on an embedding model) and its response
shapes."""

import logging
from collections.abc import Callable, Iterator

import pytest
import torch
import torch.nn.functional as F
import transformers
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from pagedllm.entrypoints.openai.request_logger import RequestLogger
from tests.classifier_models import hf_label_logits, save_tiny_classifier
from tests.embedding_models import embedding_folder, hf_embedding
from tests.entrypoints.openai.app_client import app_over

MODEL = "tiny-embed"
PAD = 0  # the tokenizer's pad token here: <unk>
QUERY = "what is a cat"
DOCS = ["a cat is a small animal", "stock markets fell", "cats", "a dog is not a cat"]
RERANK_PATHS = ["/rerank", "/v1/rerank", "/v2/rerank"]


@pytest.fixture(scope="module")
def folder(tiny_model_path: Callable[[str], str], tmp_path_factory: pytest.TempPathFactory) -> str:
    """The embedding tests' checkpoint, with a pad token (as most tokenizers have)."""
    target = str(tmp_path_factory.mktemp("score") / "model")
    folder = embedding_folder(tiny_model_path("llama-gqa-llama3"), target, specials=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    tokenizer.pad_token = "<unk>"
    tokenizer.save_pretrained(folder)
    return folder


def app_client(folder: str, **kwargs: object) -> Iterator[TestClient]:
    yield from app_over(
        folder, MODEL, dtype="float32", num_kv_blocks=64, max_num_batched_tokens=32, **kwargs
    )


@pytest.fixture(scope="module")
def http(folder: str) -> Iterator[TestClient]:
    yield from app_client(folder, runner="pooling")


@pytest.fixture(scope="module")
def reference(folder: str) -> Callable[[str, str], float]:
    """(text_1, text_2) -> the cosine similarity of transformers' embeddings."""
    hf = transformers.AutoModel.from_pretrained(folder, dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)

    def score(text_1: str, text_2: str) -> float:
        a, b = (hf_embedding(hf, tokenizer.encode(t), "LAST") for t in (text_1, text_2))
        return F.cosine_similarity(a, b, dim=0).item()

    return score


@pytest.fixture(scope="module")
def num_tokens(folder: str) -> Callable[[str], int]:
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    return lambda text: len(tokenizer.encode(text))


def post(http: TestClient, path: str, body: dict) -> dict:
    response = http.post(path, json={"model": MODEL, **body})
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("path", ["/score", "/v1/score"])
def test_one_against_n_equals_transformers_cosine(
    http: TestClient,
    reference: Callable[[str, str], float],
    num_tokens: Callable[[str], int],
    path: str,
) -> None:
    body = post(http, path, {"text_1": QUERY, "text_2": DOCS})
    assert body["id"].startswith("score-") and body["object"] == "list"
    assert body["model"] == MODEL and isinstance(body["created"], int)
    assert [d["index"] for d in body["data"]] == list(range(len(DOCS)))
    assert all(d["object"] == "score" for d in body["data"])
    expected = [reference(QUERY, doc) for doc in DOCS]
    assert [d["score"] for d in body["data"]] == pytest.approx(expected, abs=1e-5)
    # vLLM's count: each pair's tokens, the pad token between them; the query N times.
    tokens = sum(num_tokens(QUERY) + 1 + num_tokens(doc) for doc in DOCS)
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}


def test_n_against_n_pairs_in_order(
    http: TestClient, reference: Callable[[str, str], float]
) -> None:
    firsts, seconds = DOCS[:2], DOCS[2:]
    body = post(http, "/v1/score", {"text_1": firsts, "text_2": seconds})
    expected = [reference(a, b) for a, b in zip(firsts, seconds)]
    assert [d["score"] for d in body["data"]] == pytest.approx(expected, abs=1e-5)
    one = post(http, "/v1/score", {"text_1": DOCS[0], "text_2": DOCS[0]})
    assert [d["score"] for d in one["data"]] == pytest.approx([1.0], abs=1e-6)


@pytest.mark.parametrize(
    "sides",
    [
        {"queries": QUERY, "documents": DOCS[:2]},
        {"data_1": [QUERY], "data_2": DOCS[:2]},
    ],
)
def test_vllms_other_names_for_the_sides(http: TestClient, sides: dict) -> None:
    expected = post(http, "/score", {"text_1": QUERY, "text_2": DOCS[:2]})
    body = post(http, "/score", sides)
    assert body["data"] == expected["data"] and body["usage"] == expected["usage"]


@pytest.mark.parametrize("path", RERANK_PATHS)
def test_rerank_ranks_documents_by_score(
    http: TestClient,
    reference: Callable[[str, str], float],
    num_tokens: Callable[[str], int],
    path: str,
) -> None:
    body = post(http, path, {"query": QUERY, "documents": DOCS})
    assert body["id"].startswith("rerank-") and body["model"] == MODEL
    expected = sorted(
        ((i, reference(QUERY, doc)) for i, doc in enumerate(DOCS)), key=lambda p: -p[1]
    )
    results = body["results"]
    assert [r["index"] for r in results] == [i for i, _ in expected]
    assert [r["relevance_score"] for r in results] == pytest.approx(
        [s for _, s in expected], abs=1e-5
    )
    assert [r["document"] for r in results] == [{"text": DOCS[r["index"]]} for r in results]
    tokens = sum(num_tokens(QUERY) + 1 + num_tokens(doc) for doc in DOCS)
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}


@pytest.mark.parametrize(("top_n", "kept"), [(0, 4), (2, 2), (1, 1), (9, 4)])
def test_rerank_top_n_keeps_the_best(http: TestClient, top_n: int, kept: int) -> None:
    everything = post(http, "/rerank", {"query": QUERY, "documents": DOCS})["results"]
    body = post(http, "/rerank", {"query": QUERY, "documents": DOCS, "top_n": top_n})
    assert body["results"] == everything[:kept]
    assert body["usage"] == post(http, "/rerank", {"query": QUERY, "documents": DOCS})["usage"]


def test_truncate_prompt_tokens_cuts_every_text(
    http: TestClient, num_tokens: Callable[[str], int]
) -> None:
    body = post(http, "/v1/score", {"text_1": QUERY, "text_2": DOCS, "truncate_prompt_tokens": 3})
    assert body["usage"]["prompt_tokens"] == len(DOCS) * (3 + 1 + 3)
    long = post(
        http,
        "/v1/rerank",
        {"query": "x" * 600, "documents": ["y"] * 2, "truncate_prompt_tokens": -1},
    )
    assert long["usage"]["total_tokens"] == 2 * (512 + 1 + num_tokens("y"))


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/score", {"text_1": DOCS[:2], "text_2": DOCS[:3]}, "text_2"),
        ("/v1/score", {"text_1": DOCS[:3], "text_2": DOCS[0]}, "text_2"),
        ("/v1/score", {"text_1": [], "text_2": DOCS}, "text_1"),
        ("/v1/score", {"text_1": QUERY, "text_2": []}, "text_2"),
        ("/v1/score", {"text_1": "", "text_2": DOCS}, "text_1"),
        ("/v1/score", {"text_1": QUERY, "text_2": ["a", ""]}, "text_2"),
        ("/v1/score", {"queries": QUERY, "documents": ["a", "b"], "data_1": "c"}, "data_1"),
        ("/v1/score", {"text_1": QUERY}, "text_1"),
        ("/v1/score", {"documents": DOCS}, "documents"),
        ("/v1/score", {}, None),
        ("/v1/score", {"text_1": 5, "text_2": DOCS}, "text_1"),
        ("/v1/score", {"text_1": QUERY, "text_2": [["a"]]}, "text_2"),
        ("/v1/score", {"text_1": "x" * 600, "text_2": DOCS}, "text_1"),
        (
            "/v1/score",
            {"text_1": QUERY, "text_2": DOCS, "truncate_prompt_tokens": 0},
            "truncate_prompt_tokens",
        ),
        (
            "/v1/score",
            {"text_1": QUERY, "text_2": DOCS, "truncate_prompt_tokens": 513},
            "truncate_prompt_tokens",
        ),
        ("/v1/score", {"text_1": QUERY, "text_2": DOCS, "priority": 2}, "priority"),
        ("/rerank", {"query": QUERY, "documents": []}, "documents"),
        ("/rerank", {"query": "", "documents": DOCS}, "query"),
        ("/rerank", {"query": QUERY, "documents": "a single text"}, "documents"),
        ("/rerank", {"query": [QUERY], "documents": DOCS}, "query"),
        ("/rerank", {"documents": DOCS}, "query"),
        ("/rerank", {"query": QUERY, "documents": DOCS, "top_n": -1}, "top_n"),
        (
            "/rerank",
            {"query": QUERY, "documents": DOCS, "truncate_prompt_tokens": 513},
            "truncate_prompt_tokens",
        ),
        ("/v2/rerank", {"query": QUERY, "documents": ["y" * 600]}, "documents"),
    ],
)
def test_bad_requests_get_400_naming_the_field(
    http: TestClient, path: str, body: dict, param: str | None
) -> None:
    response = http.post(path, json={"model": MODEL, **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param, error
    if param is None:
        assert error["message"]


def test_unknown_model_gets_404(http: TestClient) -> None:
    response = http.post("/v1/rerank", json={"model": "other", "query": "a", "documents": ["b"]})
    assert response.status_code == 404


def test_request_id_header_names_the_answer(http: TestClient) -> None:
    headers = {"X-Request-Id": "abc"}
    response = http.post("/score", json={"text_1": "a", "text_2": "b"}, headers=headers)
    assert response.json()["id"] == "score-abc"
    response = http.post("/rerank", json={"query": "a", "documents": ["b"]}, headers=headers)
    assert response.json()["id"] == "rerank-abc"


@pytest.mark.parametrize(
    ("path", "body", "api"),
    [
        ("/v1/score", {"text_1": "a", "text_2": "b"}, "Score"),
        ("/score", {"text_1": "a", "text_2": "b"}, "Score"),
        ("/v1/rerank", {"query": "a", "documents": ["b"]}, "Rerank"),
    ],
)
def test_a_generating_server_refuses_as_it_refuses_embeddings(
    folder: str, path: str, body: dict, api: str
) -> None:
    for http in app_client(folder, runner="generate"):
        response = http.post(path, json={"model": MODEL, **body})
        assert response.status_code == 400
        error = response.json()["error"]
        assert f"does not support the {api} API" in error["message"]
        assert "--runner pooling" in error["message"] and error["param"] == "model"


def test_metrics_count_each_text_as_a_pooling_request(
    http: TestClient, num_tokens: Callable[[str], int]
) -> None:
    """As /v1/embeddings counts its inputs: the query once, each document once."""

    def values() -> dict[str, float]:
        families = text_string_to_metric_families(http.get("/metrics").text)
        samples = [s for f in families for s in f.samples]
        return {
            name: sum(s.value for s in samples if s.name == name)
            for name in ("vllm:request_success_total", "vllm:prompt_tokens_total")
        }

    before = values()
    post(http, "/rerank", {"query": "q", "documents": ["d1", "d22"]})
    after = values()
    assert {name: after[name] - before[name] for name in after} == {
        "vllm:request_success_total": 3,
        "vllm:prompt_tokens_total": num_tokens("q") + num_tokens("d1") + num_tokens("d22"),
    }


def test_openapi_schema_describes_every_path(http: TestClient) -> None:
    schema = http.get("/openapi.json").json()
    for path in ("/score", "/v1/score", *RERANK_PATHS):
        assert "requestBody" in schema["paths"][path]["post"]
        assert "400" in schema["paths"][path]["post"]["responses"]
    for name in ("ScoreRequest", "ScoreResponse", "RerankRequest", "RerankResponse"):
        assert name in schema["components"]["schemas"]


def test_enable_log_requests_logs_each_text_under_the_answers_id(folder: str) -> None:
    """--enable-log-requests: one line per text, `<id>-N` as /v1/embeddings logs its inputs."""
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    logging.getLogger("pagedllm.requests").addHandler(handler)
    try:
        for http in app_client(folder, request_logger=RequestLogger(), runner="pooling"):
            headers = {"X-Request-Id": "abc"}
            body = {"query": "q", "documents": ["d1", "d2"]}
            assert http.post("/rerank", json=body, headers=headers).status_code == 200
    finally:
        logging.getLogger("pagedllm.requests").removeHandler(handler)
    ids = [line.split(":")[0].removeprefix("Received request ") for line in records]
    assert ids == ["rerank-abc-0", "rerank-abc-1", "rerank-abc-2"]


# A cross-encoder: a classifier with one label scores each pair as one prompt. Reference:
# transformers' AutoModelForSequenceClassification logit of the pair's token ids (the
# tokenizer's pair encoding, or the score template's text), through a sigmoid.

SCORE_TEMPLATE = "{% for m in messages %}{{ m['role'] }}={{ m['content'] }};{% endfor %}"


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory: pytest.TempPathFactory) -> str:
    return save_tiny_classifier("qwen3", str(tmp_path_factory.mktemp("cross-encoder")), 1)


@pytest.fixture(scope="module")
def cross_http(cross_encoder: str) -> Iterator[TestClient]:
    yield from app_client(cross_encoder)


@pytest.fixture(scope="module")
def pair_logit(cross_encoder: str) -> Callable[[list[int]], float]:
    """A pair prompt's token ids -> transformers' one label logit."""
    return lambda ids: hf_label_logits(cross_encoder, [ids])[0][0].item()


@pytest.fixture(scope="module")
def pair_ids(cross_encoder: str) -> Callable[[str, str], list[int]]:
    tokenizer = transformers.AutoTokenizer.from_pretrained(cross_encoder)
    return lambda text_1, text_2, **cut: tokenizer(text=text_1, text_pair=text_2, **cut)[
        "input_ids"
    ]


def sigmoid(x: float) -> float:
    return torch.sigmoid(torch.tensor(x)).item()


@pytest.mark.parametrize("path", ["/score", "/v1/score"])
@pytest.mark.parametrize(
    ("text_1", "text_2", "firsts"),
    [(QUERY, DOCS, [QUERY] * 4), (DOCS[:2], DOCS[2:], DOCS[:2]), ([QUERY], DOCS[:1], [QUERY])],
)
def test_cross_encoder_scores_each_pair_as_one_prompt(
    cross_http: TestClient,
    pair_logit: Callable[[list[int]], float],
    pair_ids: Callable[[str, str], list[int]],
    path: str,
    text_1: str | list[str],
    text_2: list[str],
    firsts: list[str],
) -> None:
    """`firsts`: the first text of each pair (vLLM's pairing: 1 against N, N against N)."""
    body = post(cross_http, path, {"text_1": text_1, "text_2": text_2})
    pairs = [pair_ids(a, b) for a, b in zip(firsts, text_2, strict=True)]
    assert [d["index"] for d in body["data"]] == list(range(len(pairs)))
    expected = [sigmoid(pair_logit(ids)) for ids in pairs]
    assert [d["score"] for d in body["data"]] == pytest.approx(expected, abs=1e-5)
    tokens = sum(len(ids) for ids in pairs)
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}


@pytest.mark.parametrize("path", RERANK_PATHS)
def test_cross_encoder_rerank_ranks_by_the_pairs_logit(
    cross_http: TestClient,
    pair_logit: Callable[[list[int]], float],
    pair_ids: Callable[[str, str], list[int]],
    path: str,
) -> None:
    body = post(cross_http, path, {"query": QUERY, "documents": DOCS})
    expected = sorted(
        ((i, sigmoid(pair_logit(pair_ids(QUERY, doc)))) for i, doc in enumerate(DOCS)),
        key=lambda p: -p[1],
    )
    results = body["results"]
    assert [r["index"] for r in results] == [i for i, _ in expected]
    assert [r["relevance_score"] for r in results] == pytest.approx(
        [s for _, s in expected], abs=1e-5
    )
    assert [r["document"]["text"] for r in results] == [DOCS[i] for i, _ in expected]
    top = post(cross_http, path, {"query": QUERY, "documents": DOCS, "top_n": 2})["results"]
    assert top == results[:2]


def test_cross_encoder_use_activation_false_gives_the_raw_logit(
    cross_http: TestClient,
    pair_logit: Callable[[list[int]], float],
    pair_ids: Callable[[str, str], list[int]],
) -> None:
    expected = [pair_logit(pair_ids(QUERY, doc)) for doc in DOCS[:2]]
    body = {"text_1": QUERY, "text_2": DOCS[:2], "use_activation": False}
    scores = [d["score"] for d in post(cross_http, "/score", body)["data"]]
    assert scores == pytest.approx(expected, abs=1e-5)
    assert any(not 0 < s < 1 for s in scores)  # raw: not squashed into (0, 1)
    body = {"query": QUERY, "documents": DOCS[:2], "use_activation": False}
    reranked = post(cross_http, "/rerank", body)["results"]
    assert sorted(r["relevance_score"] for r in reranked) == pytest.approx(
        sorted(expected), abs=1e-5
    )


def test_the_servers_chat_template_is_the_score_template(
    cross_encoder: str, pair_logit: Callable[[list[int]], float]
) -> None:
    """vLLM's: --chat-template renders the pair as messages [query, document]."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(cross_encoder)
    for http in app_client(cross_encoder, chat_template=SCORE_TEMPLATE):
        body = post(http, "/rerank", {"query": "q", "documents": ["d1", "d22"]})
    for result in body["results"]:
        text = f"query=q;document={['d1', 'd22'][result['index']]};"
        ids = tokenizer(text)["input_ids"]
        assert result["relevance_score"] == pytest.approx(sigmoid(pair_logit(ids)), abs=1e-5)
    assert body["usage"]["prompt_tokens"] == len("query=q;document=d1;") * 2 + 1


def test_cross_encoder_truncation_cuts_each_pair_as_the_tokenizer_does(
    cross_http: TestClient,
    pair_logit: Callable[[list[int]], float],
    pair_ids: Callable[..., list[int]],
) -> None:
    """vLLM's rule: the tokenizer's truncation of the pair (longest_first: the longer text
    loses tokens first), so the query stays in every pair."""
    body = {"text_1": QUERY, "text_2": DOCS, "truncate_prompt_tokens": 8}
    answer = post(cross_http, "/v1/score", body)
    cut = [pair_ids(QUERY, doc, truncation=True, max_length=8) for doc in DOCS]
    assert answer["usage"]["prompt_tokens"] == sum(len(ids) for ids in cut)
    expected = [sigmoid(pair_logit(ids)) for ids in cut]
    assert [d["score"] for d in answer["data"]] == pytest.approx(expected, abs=1e-5)
    assert all(ids[:4] == pair_ids(QUERY, "")[:4] for ids in cut), "the query's start stays"


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/score", {"text_1": "", "text_2": DOCS}, "text_1"),
        ("/v1/score", {"text_1": QUERY, "text_2": ["a", ""]}, "text_2"),
        ("/v1/score", {"text_1": "x" * 300, "text_2": "y" * 300}, "text_2"),
        ("/rerank", {"query": "", "documents": DOCS}, "query"),
        ("/rerank", {"query": "x" * 300, "documents": ["y", "y" * 300]}, "documents"),
        ("/rerank", {"query": QUERY, "documents": DOCS, "use_activation": 3}, "use_activation"),
        ("/rerank", {"query": QUERY, "documents": DOCS, "softmax": True}, "softmax"),
    ],
)
def test_cross_encoder_bad_requests_get_400_naming_the_field(
    cross_http: TestClient, path: str, body: dict, param: str
) -> None:
    response = cross_http.post(path, json={"model": MODEL, **body})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param, response.json()


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/score", {"text_1": "a", "text_2": "b"}),
        ("/v2/rerank", {"query": "a", "documents": ["b"]}),
    ],
)
def test_a_classifier_of_several_labels_does_not_score_pairs(
    tmp_path_factory: pytest.TempPathFactory, path: str, body: dict
) -> None:
    folder = save_tiny_classifier("qwen3", str(tmp_path_factory.mktemp("three-labels")), 3)
    for http in app_client(folder):
        response = http.post(path, json={"model": MODEL, **body})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "model"
    assert error["message"].endswith("this model is a classifier; it serves /classify")
