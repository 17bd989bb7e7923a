"""`pagedllm bench throughput` on a tiny model: the accounting, not the speed. Reference: the
token counts of the seeded requests (datasets.random_requests) and the printed table."""

import argparse
import importlib.util
import json
from collections.abc import Callable

import pytest

from pagedllm.benchmarks import hf_backend
from pagedllm.benchmarks.cli import add_parser
from pagedllm.benchmarks.datasets import random_requests
from pagedllm.benchmarks.throughput import run_throughput
from tests.benchmarks.conftest import TINY_ENGINE_FLAGS, TINY_MODEL
from tests.devices import DEVICES

NUM_PROMPTS, INPUT_LEN, OUTPUT_LEN = 6, (4, 24), (2, 7)


def _table_rows(text: str) -> dict[str, list[str]]:
    return {line.split()[0]: line.split()[1:] for line in text.splitlines()[2:]}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("temperature", ["0", "0.8"])
def test_throughput_accounting_ratios_and_json(
    run_bench: Callable[[list[str]], str],
    tiny_model_path: Callable[[str], str],
    tmp_path: object,
    temperature: str,
    device: str,
) -> None:
    """On CUDA, hf runs there too and the CPU-only peers are skipped."""
    json_path = f"{tmp_path}/throughput.json"
    argv = ["throughput", "--model", tiny_model_path(TINY_MODEL), "--backend", "all"]
    argv += ["--num-prompts", str(NUM_PROMPTS), "--input-len", "4:24", "--output-len", "2:7"]
    argv += ["--temperature", temperature, "--hf-batch-size", "4", "--json", json_path]
    argv += ["--device", device]
    out = run_bench(argv + TINY_ENGINE_FLAGS)

    requests = random_requests(NUM_PROMPTS, INPUT_LEN, OUTPUT_LEN, vocab_size=320, seed=0)
    input_tokens = sum(r.prompt_len for r in requests)
    output_tokens = sum(r.output_len for r in requests)
    rows = _table_rows(out)
    for backend in ("pagedllm", "hf"):
        assert int(rows[backend][3]) == input_tokens
        assert int(rows[backend][4]) == output_tokens
    ours, peer = (list(map(float, rows[b][:3])) for b in ("pagedllm", "hf"))
    printed_ratios = [float(r.rstrip("x")) for r in rows["pagedllm/hf"]]
    for o, p, ratio in zip(ours, peer, printed_ratios):
        assert ratio == pytest.approx(o / p, rel=2e-3, abs=5e-4)  # printed to 3 decimals
    if device == "cuda":
        for peer in ("llama.cpp", "vllm"):
            assert f"skipped: {peer} runs on the CPU only and pagedllm on cuda" in out
    elif importlib.util.find_spec("llama_cpp") is None:
        assert "llama.cpp           skipped: pip install llama-cpp-python" in out
    if device == "cpu":
        assert "vllm                skipped: give --vllm-python PATH" in out

    report = json.load(open(json_path))
    assert set(report) == {"benchmark", "config", "results", "ratios"}
    result = report["results"]["pagedllm"]
    assert result["input_tokens"] == input_tokens and result["output_tokens"] == output_tokens
    rate_keys = {"requests_per_s", "total_tokens_per_s", "output_tokens_per_s"}
    assert rate_keys | {"elapsed_s", "startup_s", "num_requests"} <= set(result)
    assert set(report["ratios"]["hf"]) == rate_keys
    assert result["output_tokens_per_s"] == pytest.approx(
        output_tokens / result["elapsed_s"], rel=1e-9
    )
    # Each request's tokens take a step each (its first with its prompt's last chunk).
    assert max(r.output_len for r in requests) <= result["steps"] <= output_tokens
    ms = 1e3 * result["elapsed_s"] / result["steps"]
    assert f"pagedllm: {result['steps']} engine steps, {ms:.3f} ms a step" in out
    assert ("async scheduling" in result["detail"]) == (device == "cuda")


def test_throughput_rejects_unknown_backend(
    run_bench: Callable[[list[str]], str], tiny_model_path: Callable[[str], str]
) -> None:
    with pytest.raises(ValueError, match="--backend 'sglang'"):
        run_bench(["throughput", "--model", tiny_model_path(TINY_MODEL), "--backend", "sglang"])


def test_throughput_rejects_an_empty_hf_sample(
    run_bench: Callable[[list[str]], str], tiny_model_path: Callable[[str], str]
) -> None:
    argv = ["throughput", "--model", tiny_model_path(TINY_MODEL), "--hf-num-prompts", "0"]
    with pytest.raises(ValueError, match="--hf-num-prompts 0 must be >= 1"):
        run_bench([*argv, "--backend", "hf", *TINY_ENGINE_FLAGS])


def test_warmup_prompts_run_untimed_and_the_json_follows_each_backend(
    tiny_model_path: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each backend runs the warm-up requests (fresh prompts) before the timed job, which
    alone is counted; the partial report after pagedllm already has its result."""
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    argv = ["bench", "throughput", "--model", tiny_model_path(TINY_MODEL), "--num-prompts", "3"]
    argv += ["--input-len", "4", "--output-len", "2", "--backend", "pagedllm,hf"]
    args = parser.parse_args([*argv, "--num-warmup-prompts", "2", *TINY_ENGINE_FLAGS])
    generated: list[list[int]] = []  # prompts each backend ran, in order
    real_generate = hf_backend.generate_batch

    def hf_generate(model: object, batch: list, *rest: object) -> object:
        generated.extend(r.prompt_token_ids for r in batch)
        return real_generate(model, batch, *rest)

    monkeypatch.setattr(hf_backend, "generate_batch", hf_generate)
    partial: list[dict] = []
    report = run_throughput(args, ["pagedllm", "hf"], partial.append)
    job = [r.prompt_token_ids for r in random_requests(3, (4, 4), (2, 2), 320, seed=0)]
    warmup = [r.prompt_token_ids for r in random_requests(2, (4, 4), (2, 2), 320, seed=2)]
    assert sorted(generated[:2]) == sorted(warmup) and sorted(generated[2:]) == sorted(job)
    assert report["results"]["hf"]["num_requests"] == 3
    assert report["config"]["num_warmup_prompts"] == 2
    assert [sorted(p["results"]) for p in partial] == [["pagedllm"], ["hf", "pagedllm"]]
    assert partial[0]["ratios"] == {} and partial[1] == report
