"""LLM.score on an embedding model (pagedllm/llm.py, pagedllm/scoring.py). Reference: the
cosine similarity of LLM.embed's vectors of the same prompts, computed here, and once of
transformers' pooled hidden states (tests/embedding_models.py) of the tiny checkpoint; vLLM's
pairing (1:N, N:N, else ValueError) and its pair tokens."""

from collections.abc import Callable, Iterator

import pytest
import torch
import torch.nn.functional as F
import transformers

from pagedllm import LLM, PoolingParams, ScoringRequestOutput
from tests.embedding_models import embedding_folder, hf_embedding

PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12], [40, 41], [7, 6, 5, 4, 3, 99, 100]]


def tokens(ids: list[int]) -> dict:
    return {"prompt_token_ids": ids}


def cosine(a: list[float], b: list[float]) -> float:
    return F.cosine_similarity(torch.tensor(a), torch.tensor(b), dim=0).item()


@pytest.fixture(scope="module")
def folder(tiny_model_path: Callable[[str], str]) -> str:
    return tiny_model_path("llama-gqa-llama3")


@pytest.fixture(scope="module")
def llm(folder: str) -> Iterator[LLM]:
    config = {"pooling_type": "MEAN"}
    with LLM(
        folder,
        dtype="float32",
        runner="pooling",
        pooler_config=config,
        skip_tokenizer_init=True,
        max_num_batched_tokens=32,
        num_kv_blocks=64,
    ) as llm:
        yield llm


@pytest.fixture(scope="module")
def embeddings(llm: LLM) -> list[list[float]]:
    return [o.outputs.embedding for o in llm.embed([tokens(p) for p in PROMPTS], use_tqdm=False)]


def test_one_against_n_equals_transformers_cosine(llm: LLM, folder: str) -> None:
    hf = transformers.AutoModel.from_pretrained(folder, dtype=torch.float32).eval()
    outputs = llm.score(tokens(PROMPTS[0]), [tokens(p) for p in PROMPTS[1:]], use_tqdm=False)
    query = hf_embedding(hf, PROMPTS[0], "MEAN")
    expected = [
        F.cosine_similarity(query, hf_embedding(hf, p, "MEAN"), dim=0).item() for p in PROMPTS[1:]
    ]
    assert all(isinstance(o, ScoringRequestOutput) and o.finished for o in outputs)
    assert [o.outputs.score for o in outputs] == pytest.approx(expected, abs=1e-5)


def test_one_against_n_equals_cosine_of_embed(llm: LLM, embeddings: list[list[float]]) -> None:
    outputs = llm.score(tokens(PROMPTS[0]), [tokens(p) for p in PROMPTS[1:]], use_tqdm=False)
    expected = [cosine(embeddings[0], e) for e in embeddings[1:]]
    assert [o.outputs.score for o in outputs] == pytest.approx(expected, abs=1e-6)
    # No tokenizer here (skip_tokenizer_init), so no pad token between a pair's prompts.
    assert [o.prompt_token_ids for o in outputs] == [PROMPTS[0] + p for p in PROMPTS[1:]]
    first, second = outputs[0].request_id.split("_")
    assert first != second, "the pair's request ids, joined"


def test_n_against_n_pairs_in_order(llm: LLM, embeddings: list[list[float]]) -> None:
    firsts, seconds = [tokens(p) for p in PROMPTS[:2]], [tokens(p) for p in PROMPTS[2:]]
    outputs = llm.score(firsts, seconds, use_tqdm=False)
    expected = [cosine(embeddings[0], embeddings[2]), cosine(embeddings[1], embeddings[3])]
    assert [o.outputs.score for o in outputs] == pytest.approx(expected, abs=1e-6)
    (one,) = llm.score(tokens(PROMPTS[1]), tokens(PROMPTS[1]), use_tqdm=False)
    assert one.outputs.score == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize(
    ("data_1", "data_2", "message"),
    [
        ([PROMPTS[0], PROMPTS[1]], PROMPTS[:3], "data_2 has 3 texts for the 2 of data_1"),
        (PROMPTS[:3], [PROMPTS[0]], "data_2 has 1 texts for the 3 of data_1"),
        ([], [PROMPTS[0]], "data_1 is empty"),
        ([PROMPTS[0]], [], "data_2 is empty"),
    ],
)
def test_other_lengths_raise(llm: LLM, data_1: list, data_2: list, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        llm.score([tokens(p) for p in data_1], [tokens(p) for p in data_2], use_tqdm=False)


def test_truncate_prompt_tokens_and_pooling_params_reach_each_prompt(
    llm: LLM, embeddings: list[list[float]]
) -> None:
    """truncate_prompt_tokens keeps each prompt's last N tokens, both sides' (PROMPTS[2]
    has 2); the score is the cosine, normalised or not."""
    long, short, other = tokens(PROMPTS[3]), tokens(PROMPTS[3][-2:]), tokens(PROMPTS[2])
    (cut,) = llm.score(long, other, truncate_prompt_tokens=2, use_tqdm=False)
    (alone,) = llm.score(short, other, use_tqdm=False)
    assert cut.outputs.score == alone.outputs.score
    assert cut.prompt_token_ids == PROMPTS[3][-2:] + PROMPTS[2]
    params = PoolingParams(normalize=False)
    (raw,) = llm.score(tokens(PROMPTS[0]), tokens(PROMPTS[1]), pooling_params=params)
    assert raw.outputs.score == pytest.approx(cosine(embeddings[0], embeddings[1]), abs=1e-5)


def test_truncate_prompt_tokens_over_max_model_len_raises(llm: LLM) -> None:
    """vLLM's LLM refuses a truncation it cannot honour, with this message."""
    limit = llm.llm_engine.config.model_config.max_model_len
    message = rf"truncate_prompt_tokens value \({limit + 1}\) is greater than max_model_len"
    with pytest.raises(ValueError, match=message):
        llm.score(tokens(PROMPTS[0]), tokens(PROMPTS[1]), truncate_prompt_tokens=limit + 1)
    with pytest.raises(ValueError, match=message):
        llm.embed([tokens(PROMPTS[0])], truncate_prompt_tokens=limit + 1, use_tqdm=False)


def test_texts_score_with_the_tokenizers_ids(
    tiny_model_path: Callable[[str], str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    target = str(tmp_path_factory.mktemp("score") / "model")
    folder = embedding_folder(tiny_model_path("qwen3"), target, specials=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    texts = ["a query", "a document", "another one"]
    with LLM(folder, dtype="float32", runner="pooling", num_kv_blocks=32) as llm:
        outputs = llm.score(texts[0], texts[1:], use_tqdm=False)
        vectors = [o.outputs.embedding for o in llm.embed(texts, use_tqdm=False)]
    ids = [tokenizer.encode(t) for t in texts]
    assert [o.prompt_token_ids for o in outputs] == [ids[0] + ids[1], ids[0] + ids[2]]
    expected = [cosine(vectors[0], v) for v in vectors[1:]]
    assert [o.outputs.score for o in outputs] == pytest.approx(expected, abs=1e-6)


def test_a_generating_model_refuses_score(folder: str) -> None:
    with LLM(folder, dtype="float32", skip_tokenizer_init=True, num_kv_blocks=32) as llm:
        with pytest.raises(ValueError, match="runner='pooling'"):
            llm.score(tokens(PROMPTS[0]), tokens(PROMPTS[1]))
