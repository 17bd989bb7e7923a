"""pagedllm/benchmarks/cli.py: the `bench` sub-commands, their defaults (from the issue) and
--backend parsing."""

import argparse

import pytest

from pagedllm.benchmarks.cli import add_parser, on_gguf_copy, parse_backends


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="pagedllm")
    add_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def test_defaults_follow_the_issue() -> None:
    t = _parse(["bench", "throughput"])
    assert (t.num_prompts, t.input_len, t.output_len, t.temperature) == (256, "32:512", "32:256", 0)
    assert (t.backend, t.hf_batch_size, t.model, t.json) == ("all", 16, None, None)
    assert (t.vllm_python, t.vllm_kv_cache_gib, t.dtype) == (None, None, "auto")
    lat = _parse(["bench", "latency"])
    assert (lat.batch_size, lat.input_len, lat.output_len) == (1, 32, 128)
    assert (lat.num_iters, lat.num_warmup, lat.backend) == (5, 1, "pagedllm")
    lin = _parse(["bench", "linear"])
    assert (lin.rows, lin.dtype, lin.isa, lin.weight_mb) == (
        "1,16,64,256,512,2048",
        "float32",
        None,
        512,
    )
    s = _parse(["bench", "serve", "--request-rate", "inf"])
    assert (s.url, s.request_rate, s.model) == ("http://127.0.0.1:8000", float("inf"), None)


def test_a_benchmark_is_required() -> None:
    with pytest.raises(SystemExit):
        _parse(["bench"])


def test_parse_backends() -> None:
    choices = ("pagedllm", "hf", "llama.cpp")
    assert parse_backends("all", choices) == list(choices)
    assert parse_backends("hf, pagedllm,hf", choices) == ["hf", "pagedllm"]
    with pytest.raises(ValueError, match="--backend 'sglang'"):
        parse_backends("sglang", choices)


def test_perplexity_and_gguf_type_defaults() -> None:
    p = _parse(["bench", "perplexity"])
    assert (p.text, p.window, p.gguf_type, p.quantization) == (None, 512, None, None)
    lat = _parse(["bench", "latency", "--gguf-type", "q8_0", "--quantization", "none"])
    assert (lat.gguf_type, lat.quantization) == ("q8_0", "none")
    with pytest.raises(SystemExit):
        _parse(["bench", "throughput", "--gguf-type", "q4_0"])


def test_on_gguf_copy_needs_a_gguf_model(tmp_path: object) -> None:
    args = _parse(["bench", "latency", "--model", str(tmp_path), "--gguf-type", "f32"])
    with pytest.raises(ValueError, match="--gguf-type f32 needs a .gguf model"):
        on_gguf_copy(args)
    args = _parse(["bench", "latency", "--model", str(tmp_path)])
    assert on_gguf_copy(args) is args
