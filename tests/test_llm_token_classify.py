"""LLM.encode(pooling_task="token_classify") on token classifiers (pagedllm/llm.py,
classifier_config.py, layers/pooler.py's ALL, layers/classifier.py,
model_loader/seq_cls_model.py). Reference: transformers' AutoModelForTokenClassification on
the same tiny checkpoints in float32: every token's score-head logits (bias included), and
their softmax (vLLM's default activation for token_classify). Within 1e-4, prompts longer
than a chunk (chunked prefill) included, in batches of several prompts."""

import pytest
import torch

from pagedllm import LLM, PoolingParams
from tests.classifier_models import hf_token_logits, save_tiny_token_classifier

CHUNK = 32  # max_num_batched_tokens: the 70- and 150-token prompts run in several chunks


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(5)
    return [torch.randint(3, 259, (n,), generator=gen).tolist() for n in (1, 9, 70, 150)]


def token_classifier_llm(folder: str, **kwargs: object) -> LLM:
    return LLM(folder, dtype="float32", max_num_batched_tokens=CHUNK, num_kv_blocks=64, **kwargs)


def encode(llm: LLM, prompts: list[list[int]], **kwargs: object) -> list[torch.Tensor]:
    outputs = llm.encode([{"prompt_token_ids": p} for p in prompts], use_tqdm=False, **kwargs)
    return [o.outputs.data for o in outputs]


@pytest.mark.parametrize(
    ("name", "fields"),
    [("llama-gqa-llama3", {}), ("qwen2", {}), ("qwen3", {"token_classification_bias": False})],
)
def test_token_classify_equals_transformers(
    tmp_path, prompts: list[list[int]], name: str, fields: dict
) -> None:
    folder = save_tiny_token_classifier(name, str(tmp_path), 5, **fields)
    expected = hf_token_logits(folder, prompts)
    with token_classifier_llm(folder) as llm:
        assert llm.llm_engine.config.model_config.pooling_tasks == ("token_classify",)
        raw = encode(llm, prompts, pooling_params=PoolingParams(use_activation=False))
        probs = encode(llm, prompts, pooling_task="token_classify")
        assert llm.llm_engine.block_manager.num_free_blocks == 64, "no KV outlives a request"
    for got, want in zip(raw, expected):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    for got, want in zip(probs, expected):
        torch.testing.assert_close(got, want.softmax(-1), atol=1e-4, rtol=0)


def test_other_tasks_and_embedding_fields_are_refused(tmp_path) -> None:
    """vLLM serves a token classifier's token_classify only: LLM.classify, LLM.embed and
    an embedding's fields name what to use instead; a pooling type other than ALL too."""
    folder = save_tiny_token_classifier("qwen2", str(tmp_path), 3)
    with token_classifier_llm(folder) as llm:
        with pytest.raises(ValueError, match="pooling_task='token_classify'"):
            llm.classify("hello", use_tqdm=False)
        with pytest.raises(ValueError, match="this model is a token classifier"):
            llm.embed("hello", use_tqdm=False)
        with pytest.raises(ValueError, match="task 'classify': this model's pooling tasks"):
            llm.encode("hello", use_tqdm=False, pooling_task="classify")
        with pytest.raises(ValueError, match="dimensions is for embeddings"):
            llm.encode("hello", PoolingParams(dimensions=2), use_tqdm=False)
    with pytest.raises(ValueError, match="classifies every token, so it pools ALL"):
        token_classifier_llm(folder, pooler_config={"pooling_type": "MEAN"})
