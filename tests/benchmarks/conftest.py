"""Benchmark tests run the `pagedllm bench` parser on a tiny random model without a tokenizer
(tiny_model_path comes from tests/conftest.py), or on small GGUF files written here."""

import argparse
from collections.abc import Callable

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter
from gguf.quants import quantize

from pagedllm.benchmarks.cli import add_parser
from tests.gguf.tiny_gguf import gguf_tensors, tiny_model, write_gguf

TINY_MODEL = "llama-tied-mqa"
# The tiny model has no tokenizer and a small KV cache is plenty.
TINY_ENGINE_FLAGS = ["--skip-tokenizer-init", "--num-kv-blocks", "64"]

Q8_0, F16, F32 = GGMLQuantizationType.Q8_0, GGMLQuantizationType.F16, GGMLQuantizationType.F32
# name -> (shape in torch order, stored type): one tensor of each case a GGUF copy handles.
MIXED_TENSORS = {
    "token_embd.weight": ((8, 64), Q8_0),
    "blk.0.attn_q.weight": ((4, 64), F16),
    "blk.0.ffn_down.weight": ((4, 48), F16),  # rows of 48: not whole Q8_0 blocks of 32
    "blk.0.ffn_gate_inp.weight": ((4, 64), F32),  # a MoE router
    "output_norm.weight": ((64,), F32),
}


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


def write_mixed_gguf(path: str, quantized: bool = True) -> None:
    """A llama-like GGUF with metadata of each kind and MIXED_TENSORS (all F32 if not
    `quantized`); not a runnable model."""
    rng = np.random.default_rng(0)
    writer = GGUFWriter(path, "llama")
    writer.add_block_count(1)
    writer.add_rope_freq_base(10000.0)
    writer.add_file_type(2 if quantized else 0)
    writer.add_key_value("tokenizer.ggml.tokens", ["a", "b"], GGUFValueType.ARRAY)
    writer.add_key_value("tokenizer.ggml.token_type", [1, 3], GGUFValueType.ARRAY)
    for name, (shape, kind) in MIXED_TENSORS.items():
        kind = kind if quantized else F32
        data = rng.standard_normal(shape, dtype=np.float32)
        writer.add_tensor(name, quantize(data, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="session")
def tiny_gguf_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny random llama (tests/gguf/tiny_gguf.py) as an all-F32 GGUF file, no tokenizer."""
    model = tiny_model("llama")
    path = str(tmp_path_factory.mktemp("tiny_gguf") / "tiny-llama.gguf")
    write_gguf(path, "llama", model.config, gguf_tensors("llama", model.config, model.state_dict()))
    return path
