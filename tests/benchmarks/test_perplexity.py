"""pagedllm/benchmarks/perplexity.py: perplexity = exp(mean negative log-likelihood) of each token
given the tokens before it in its window. References: transformers' logits on the same windows
(tiny model), the tokenizer's count of the fixture text, and that formula."""

import hashlib
import json
import math
from collections.abc import Callable

import pytest
import torch
from torch import nn

from pagedllm.benchmarks.perplexity import DEFAULT_TEXT, perplexity, text_windows, token_nlls
from pagedllm.config import default_model_path
from pagedllm.gguf.tokenizer import load_gguf_tokenizer
from pagedllm.llm import LLM
from tests.benchmarks.conftest import TINY_ENGINE_FLAGS, TINY_MODEL

FIXTURE_SHA256 = "637e1f0ba8d2ec5dafcc6e7c82daf2bb31b60e647f994bca42046ce45cb9475e"


def test_text_windows_are_consecutive_and_drop_a_lone_last_token() -> None:
    assert text_windows(list(range(8)), 3) == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert text_windows(list(range(7)), 3) == [[0, 1, 2], [3, 4, 5]]
    with pytest.raises(ValueError, match="window 1 must be >= 2"):
        text_windows(list(range(8)), 1)
    with pytest.raises(ValueError, match="the text has 1 tokens"):
        text_windows([5], 4)


def _reference_nlls(model: nn.Module, token_ids: list[int], window: int) -> list[float]:
    """-log_softmax(transformers' logits) at each next token, window by window."""
    nlls = []
    with torch.no_grad():
        for w in text_windows(token_ids, window):
            ids = torch.tensor([w])
            logprobs = model(ids).logits[0].log_softmax(-1)
            nlls += (-logprobs[:-1].gather(1, ids[0, 1:, None])[:, 0]).tolist()
    return nlls


def test_perplexity_matches_transformers(
    tiny_model_path: Callable[[str], str], hf_model: Callable[[str], nn.Module]
) -> None:
    token_ids = torch.randint(3, 320, (300,)).tolist()
    with LLM(
        tiny_model_path(TINY_MODEL), skip_tokenizer_init=True, num_kv_blocks=64, dtype="float32"
    ) as llm:
        nlls = token_nlls(llm, token_ids, 128)
        result = perplexity(llm, token_ids, 128)
    reference = _reference_nlls(hf_model(TINY_MODEL), token_ids, 128)
    assert len(nlls) == 300 - 3
    assert nlls == pytest.approx(reference, abs=1e-4)
    assert result == pytest.approx(math.exp(sum(reference) / len(reference)), rel=1e-5)


def test_the_fixture_text_is_the_recorded_one() -> None:
    """tests/fixtures/README.md: its bytes and its 2,843 SmolLM2 tokens (at least 2,000)."""
    data = open(DEFAULT_TEXT, "rb").read()
    assert hashlib.sha256(data).hexdigest() == FIXTURE_SHA256
    tokenizer = load_gguf_tokenizer(default_model_path())
    assert len(tokenizer.encode(data.decode("utf-8"))) == 2843


def test_bench_perplexity_on_the_default_model(
    run_bench: Callable[[list[str]], str], tmp_path: object
) -> None:
    text = "We hold these truths to be self-evident, that all men are created equal. " * 2
    text_path, json_path = f"{tmp_path}/text.txt", f"{tmp_path}/perplexity.json"
    open(text_path, "w").write(text)
    out = run_bench(["perplexity", "--text", text_path, "--window", "8", "--json", json_path])

    report = json.load(open(json_path))
    token_ids = load_gguf_tokenizer(default_model_path()).encode(text)
    windows = text_windows(token_ids, 8)
    assert report["text_tokens"] == len(token_ids)
    assert report["windows"] == len(windows)
    assert report["scored_tokens"] == sum(len(w) - 1 for w in windows)
    assert report["config"]["window"] == 8 and report["config"]["quantization"] == "gguf"
    assert 1 < report["perplexity"] < 1000
    assert f"perplexity {report['perplexity']:.4f}" in out


def test_bench_perplexity_needs_a_tokenizer_and_a_text(
    run_bench: Callable[[list[str]], str], tiny_model_path: Callable[[str], str], tmp_path: object
) -> None:
    argv = ["perplexity", "--model", tiny_model_path(TINY_MODEL), *TINY_ENGINE_FLAGS]
    with pytest.raises(ValueError, match="drop --skip-tokenizer-init"):
        run_bench(argv)
    with pytest.raises(ValueError, match="--text '.*missing.txt' is not a file"):
        run_bench([*argv, "--text", f"{tmp_path}/missing.txt"])
