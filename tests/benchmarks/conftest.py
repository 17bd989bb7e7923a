"""Benchmark tests run the `pagedllm bench` parser on a tiny random model without a tokenizer
(tiny_model_path comes from tests/conftest.py)."""

import argparse
from collections.abc import Callable

import pytest

from pagedllm.benchmarks.cli import add_parser

TINY_MODEL = "llama-tied-mqa"
# The tiny model has no tokenizer and a small KV cache is plenty.
TINY_ENGINE_FLAGS = ["--skip-tokenizer-init", "--num-kv-blocks", "64"]


@pytest.fixture
def run_bench(capsys: pytest.CaptureFixture) -> Callable[[list[str]], str]:
    """`run_bench(["throughput", ...])` -> what `pagedllm bench throughput ...` printed."""

    def run(argv: list[str]) -> str:
        parser = argparse.ArgumentParser(prog="pagedllm")
        add_parser(parser.add_subparsers(dest="command", required=True))
        args = parser.parse_args(["bench", *argv])
        capsys.readouterr()
        args.func(args)
        return capsys.readouterr().out

    return run
