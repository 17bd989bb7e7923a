"""LLM.embed / LLM.encode on pooling models (pagedllm/llm.py). Reference: transformers'
AutoModel on the same tiny checkpoints in float32: the final hidden states (after the
final norm) pooled by the last token, the mean over the prompt's tokens or the first
token, L2-normalised; within 1e-5, prompts longer than a chunk (chunked prefill) included,
in batches of several prompts."""

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import transformers

from pagedllm import LLM, EmbeddingRequestOutput, PoolingParams, SamplingParams
from tests.devices import DEVICES
from tests.embedding_models import (
    add_dense_module,
    embedding_folder,
    hf_embedding,
    save_sentence_transformers_files,
)

CHUNK = 32  # max_num_batched_tokens: the 150- and 200-token prompts run in several chunks


def pooling_llm(folder: str, **kwargs: object) -> LLM:
    return LLM(
        folder,
        dtype="float32",
        skip_tokenizer_init=True,
        max_num_batched_tokens=CHUNK,
        num_kv_blocks=64,
        **kwargs,
    )


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(3)
    return [torch.randint(3, 320, (n,), generator=gen).tolist() for n in (1, 7, 31, 64, 150, 200)]


@pytest.mark.parametrize("name", ["llama-gqa-llama3", "qwen3"])
@pytest.mark.parametrize("pooling_type", ["LAST", "MEAN", "CLS"])
def test_embed_equals_transformers_pooled_hidden_states(
    tiny_model_path: Callable[[str], str],
    prompts: list[list[int]],
    name: str,
    pooling_type: str,
) -> None:
    folder = tiny_model_path(name)
    hf = transformers.AutoModel.from_pretrained(folder, dtype=torch.float32).eval()
    with pooling_llm(folder, runner="pooling", pooler_config={"pooling_type": pooling_type}) as llm:
        outputs = llm.embed([{"prompt_token_ids": p} for p in prompts], use_tqdm=False)
        assert llm.llm_engine.block_manager.num_free_blocks == 64, "no KV outlives a request"
    assert all(isinstance(o, EmbeddingRequestOutput) and o.finished for o in outputs)
    for prompt, output in zip(prompts, outputs, strict=True):
        assert output.prompt_token_ids == prompt
        expected = hf_embedding(hf, prompt, pooling_type)
        assert torch.tensor(output.outputs.embedding) == pytest.approx(expected, abs=1e-5)


def test_normalize_and_dimensions_per_request(
    tiny_model_path: Callable[[str], str], prompts: list[list[int]], tmp_path: Path
) -> None:
    """normalize=False gives the raw pooled state; dimensions cuts, then normalises, on a
    model whose config says Matryoshka (refused on others)."""
    folder = tiny_model_path("llama-tied-mqa")
    hf = transformers.AutoModel.from_pretrained(folder, dtype=torch.float32).eval()
    raw = hf_embedding(hf, prompts[3], "MEAN", normalize=False)
    config = {"pooling_type": "mean", "normalize": False}
    with pooling_llm(folder, runner="pooling", pooler_config=config) as llm:
        (out,) = llm.encode({"prompt_token_ids": prompts[3]}, use_tqdm=False)
        assert out.outputs.data == pytest.approx(raw, abs=1e-5)
        with pytest.raises(ValueError, match="Matryoshka"):
            llm.embed({"prompt_token_ids": prompts[3]}, PoolingParams(dimensions=16))
    matryoshka = embedding_folder(folder, str(tmp_path / "matryoshka"))
    with pooling_llm(matryoshka, runner="pooling", pooler_config=config) as llm:
        params = PoolingParams(dimensions=16, normalize=True)
        (out,) = llm.embed({"prompt_token_ids": prompts[3]}, params, use_tqdm=False)
    expected = torch.nn.functional.normalize(raw[:16], dim=-1)
    assert torch.tensor(out.outputs.embedding) == pytest.approx(expected, abs=1e-5)


def test_sentence_transformers_folder_pools_as_it_declares(
    tiny_model_path: Callable[[str], str], prompts: list[list[int]], tmp_path: Path
) -> None:
    """runner "auto" pools a folder with modules.json, by its 1_Pooling mode and Normalize."""
    folder = str(tmp_path / "st")
    shutil.copytree(tiny_model_path("qwen3"), folder)
    save_sentence_transformers_files(folder, "mean_tokens", normalize=False)
    hf = transformers.AutoModel.from_pretrained(folder, dtype=torch.float32).eval()
    with pooling_llm(folder) as llm:
        assert llm.llm_engine.model_config.runner_type == "pooling"
        assert not llm.llm_engine.config.cache_config.enable_prefix_caching
        (out,) = llm.embed({"prompt_token_ids": prompts[4]}, use_tqdm=False)
    expected = hf_embedding(hf, prompts[4], "MEAN", normalize=False)
    assert torch.tensor(out.outputs.embedding) == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_dense_modules_project_the_pooled_vector(
    tiny_model_path: Callable[[str], str], prompts: list[list[int]], tmp_path: Path, device: str
) -> None:
    """sentence-transformers' order: Pooling -> Dense (linear, then its activation; Tanh
    where the config names none) -> Normalize; `dimensions` cuts the projected vector."""
    folder = embedding_folder(tiny_model_path("qwen3"), str(tmp_path / "st"))
    save_sentence_transformers_files(folder, "cls_token", normalize=True)
    gen = torch.Generator().manual_seed(5)
    weight, bias = torch.randn(16, 64, generator=gen), torch.randn(16, generator=gen)
    add_dense_module(folder, weight, bias, None)
    hf = transformers.AutoModel.from_pretrained(folder, dtype=torch.float32).eval()
    projected = torch.tanh(F.linear(hf_embedding(hf, prompts[3], "CLS", False), weight, bias))
    with pooling_llm(folder, device=device) as llm:
        (out,) = llm.embed({"prompt_token_ids": prompts[3]}, use_tqdm=False)
        (cut,) = llm.embed(
            {"prompt_token_ids": prompts[3]}, PoolingParams(dimensions=8), use_tqdm=False
        )
        with pytest.raises(ValueError, match=r"must be in \[1, 16\]"):
            llm.embed("x", PoolingParams(dimensions=32), use_tqdm=False)
    assert torch.tensor(out.outputs.embedding) == pytest.approx(
        F.normalize(projected, dim=-1), abs=1e-5
    )
    expected = F.normalize(projected[:8], dim=-1)
    assert torch.tensor(cut.outputs.embedding) == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize("name", ["llama-gqa4", "qwen3"])
def test_bare_decoder_checkpoint_pools_without_lm_head(
    tiny_model_path: Callable[[str], str], prompts: list[list[int]], tmp_path: Path, name: str
) -> None:
    """A `*Model` checkpoint (no `model.` prefix, no LM head, as embedding models ship)
    runs as a pooling model under runner "auto"."""
    hf = transformers.AutoModel.from_pretrained(tiny_model_path(name), dtype=torch.float32)
    hf.save_pretrained(tmp_path)
    with pooling_llm(str(tmp_path)) as llm:
        assert llm.llm_engine.model_config.runner_type == "pooling"
        assert llm.llm_engine.executor.runner.model.lm_head is None
        outputs = llm.embed([{"prompt_token_ids": p} for p in prompts[:3]], use_tqdm=False)
    for prompt, output in zip(prompts, outputs):
        expected = hf_embedding(hf.eval(), prompt, "LAST")
        assert torch.tensor(output.outputs.embedding) == pytest.approx(expected, abs=1e-5)


def test_generation_and_pooling_requests_are_refused_by_the_other_runner(
    tiny_model_path: Callable[[str], str],
) -> None:
    folder = tiny_model_path("llama-tied-mqa")
    with pooling_llm(folder, runner="pooling") as llm:
        with pytest.raises(
            ValueError, match=r"embeds prompts .*; use embed \(POST /v1/embeddings\) or score"
        ):
            llm.generate({"prompt_token_ids": [5, 6]}, SamplingParams(max_tokens=2))
        with pytest.raises(TypeError, match="must be a PoolingParams .*got SamplingParams"):
            llm.encode({"prompt_token_ids": [5, 6]}, SamplingParams(), use_tqdm=False)
    with pooling_llm(folder) as llm:
        with pytest.raises(ValueError, match="runner='pooling'"):
            llm.embed({"prompt_token_ids": [5, 6]}, use_tqdm=False)


def test_truncate_prompt_tokens_pools_the_prompts_end(
    tiny_model_path: Callable[[str], str], prompts: list[list[int]]
) -> None:
    """PoolingParams.truncate_prompt_tokens (vLLM's): the last N tokens, as if sent alone."""
    folder = tiny_model_path("llama-gqa-llama3")
    with pooling_llm(folder, runner="pooling") as llm:
        (cut,) = llm.embed(
            {"prompt_token_ids": prompts[3]},
            PoolingParams(truncate_prompt_tokens=5),
            use_tqdm=False,
        )
        (alone,) = llm.embed({"prompt_token_ids": prompts[3][-5:]}, use_tqdm=False)
    assert cut.prompt_token_ids == prompts[3][-5:]
    assert cut.outputs.embedding == alone.outputs.embedding
    with pytest.raises(ValueError, match="truncate_prompt_tokens 0"):
        PoolingParams(truncate_prompt_tokens=0)
