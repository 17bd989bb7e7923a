"""pagedllm/benchmarks/spec_decode.py: `pagedllm bench spec-decode` on a tiny random model
(no tokenizer: seeded random prompts, the copy prompt a block three times). Reference:
speculative decoding's contract (greedy tokens equal to the engine without it) and the
report's own arithmetic (speedup = ngram tok/s / off tok/s)."""

import json
from collections.abc import Callable

import pytest

from tests.benchmarks.conftest import TINY_ENGINE_FLAGS, TINY_MODEL


def test_bench_spec_decode_reports_both_engines_on_each_prompt(
    run_bench: Callable[[list[str]], str], tiny_model_path: Callable[[str], str], tmp_path: object
) -> None:
    json_path = f"{tmp_path}/spec.json"
    argv = ["spec-decode", "--model", tiny_model_path(TINY_MODEL), *TINY_ENGINE_FLAGS]
    argv += ["--output-len", "24", "--num-iters", "1", "--json", json_path]
    argv += ["--speculative-config", '{"num_speculative_tokens": 3, "prompt_lookup_min": 1}']
    out = run_bench(argv)
    report = json.load(open(json_path))
    assert report["config"]["speculative_config"]["num_speculative_tokens"] == 3
    assert list(report["prompts"]) == ["copy", "quote", "story"]
    for row in report["prompts"].values():
        assert row["same_tokens"] is True
        assert row["speedup"] == pytest.approx(row["ngram_tok_s"] / row["off_tok_s"])
        assert 0 <= row["accepted_tokens"] <= row["draft_tokens"]
    assert report["prompts"]["copy"]["prompt_tokens"] == 130
    assert "| copy |" in out and "ngram / off" in out
