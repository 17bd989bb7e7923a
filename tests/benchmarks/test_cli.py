"""pagedllm/benchmarks/cli.py: the `bench` sub-commands, their defaults (from the issue) and
--backend parsing."""

import argparse

import pytest

from pagedllm.benchmarks.cli import add_parser, parse_backends


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="pagedllm")
    add_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def test_defaults_follow_the_issue() -> None:
    t = _parse(["bench", "throughput"])
    assert (t.num_prompts, t.input_len, t.output_len, t.temperature) == (256, "32:512", "32:256", 0)
    assert (t.backend, t.hf_batch_size, t.model, t.json) == ("all", 16, None, None)
    lat = _parse(["bench", "latency"])
    assert (lat.batch_size, lat.input_len, lat.output_len) == (1, 32, 128)
    assert (lat.num_iters, lat.num_warmup, lat.backend) == (5, 1, "pagedllm")
    s = _parse(["bench", "serve", "--request-rate", "inf"])
    assert (s.url, s.request_rate, s.model) == ("http://127.0.0.1:8000", float("inf"), None)


def test_a_benchmark_is_required() -> None:
    with pytest.raises(SystemExit):
        _parse(["bench"])


def test_parse_backends() -> None:
    choices = ("pagedllm", "hf", "llama.cpp")
    assert parse_backends("all", choices) == list(choices)
    assert parse_backends("hf, pagedllm,hf", choices) == ["hf", "pagedllm"]
    with pytest.raises(ValueError, match="--backend 'vllm'"):
        parse_backends("vllm", choices)
