"""The llama.cpp peer, through llama-cpp-python when it is importable (an optional extra).

It runs the same model as an F32 GGUF, so it does the same arithmetic as pagedllm in float32:
a quantized GGUF (the default model is Q4_1) is dequantized once into a cached F32 copy. It
uses torch's thread count. llama-cpp-python's `Llama` holds one sequence, so requests run one
after another: prompt in one eval, then one token per eval.
"""

import importlib.util
import os
import time
from typing import TYPE_CHECKING

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, Keys
from gguf.quants import dequantize

from pagedllm.benchmarks.datasets import BenchRequest, max_total_len
from pagedllm.benchmarks.metrics import (
    BackendUnavailable,
    LatencySample,
    ThroughputResult,
    latency_sample,
)
from pagedllm.config import ModelConfig

if TYPE_CHECKING:
    from llama_cpp import Llama

SKIP_MESSAGE = "skipped: pip install llama-cpp-python"
_ALL_F32 = 0  # llama.cpp's LLAMA_FTYPE_ALL_F32, the value of general.file_type


def require_llama_cpp() -> None:
    if importlib.util.find_spec("llama_cpp") is None:
        raise BackendUnavailable(SKIP_MESSAGE)


def _cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "pagedllm")


def f32_gguf_path(model_config: ModelConfig) -> str:
    """An F32 GGUF of the model: the model itself if already all F32, else a cached copy."""
    source = model_config.gguf_file
    if source is None:
        raise BackendUnavailable(
            f"skipped: llama.cpp needs a GGUF model, {model_config.model!r} is a HF folder "
            "(convert it with llama.cpp's convert_hf_to_gguf.py --outtype f32)"
        )
    reader = GGUFReader(source)
    if all(t.tensor_type == GGMLQuantizationType.F32 for t in reader.tensors):
        return source
    stem = os.path.splitext(os.path.basename(source))[0]
    target = os.path.join(_cache_dir(), f"{stem}.F32.gguf")
    if not os.path.isfile(target) or os.path.getmtime(target) < os.path.getmtime(source):
        os.makedirs(_cache_dir(), exist_ok=True)
        write_f32_gguf(reader, target + ".tmp")
        os.replace(target + ".tmp", target)
    return target


def write_f32_gguf(reader: GGUFReader, target: str) -> None:
    """Copy a GGUF's metadata and every tensor dequantized to F32 (file type ALL_F32)."""
    arch = reader.fields[Keys.General.ARCHITECTURE].contents()
    writer = GGUFWriter(target, arch)
    skipped = (Keys.General.ARCHITECTURE, Keys.General.ALIGNMENT, Keys.General.FILE_TYPE)
    for field in reader.fields.values():
        if field.name in skipped or field.name.startswith("GGUF."):
            continue
        value_type = field.types[0]
        sub_type = field.types[-1] if value_type == GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), value_type, sub_type=sub_type)
    writer.add_file_type(_ALL_F32)
    for tensor in reader.tensors:
        shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
        nbytes = int(np.prod(shape)) * 4
        writer.add_tensor_info(tensor.name, shape, np.float32, nbytes, GGMLQuantizationType.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tensor in reader.tensors:
        data = dequantize(tensor.data, tensor.tensor_type).astype(np.float32, copy=False)
        writer.write_tensor_data(data.reshape(-1))
    writer.close()


def load_llama(model_config: ModelConfig, n_ctx: int, threads: int) -> "Llama":
    require_llama_cpp()
    from llama_cpp import Llama

    return Llama(
        model_path=f32_gguf_path(model_config),
        n_ctx=n_ctx,
        n_threads=threads,
        n_threads_batch=threads,
        verbose=False,
    )


def _generate(llm: "Llama", request: BenchRequest, temperature: float) -> list[float]:
    """Run one request to its full output length; the time after each new token."""
    llm.reset()
    llm.eval(request.prompt_token_ids)
    times = []
    for i in range(request.output_len):
        token = llm.sample(temp=temperature, top_k=0, top_p=1.0, min_p=0.0)
        times.append(time.perf_counter())
        if i + 1 < request.output_len:
            llm.eval([token])
    return times


def run_llamacpp_throughput(
    model_config: ModelConfig, requests: list[BenchRequest], temperature: float, threads: int
) -> ThroughputResult:
    start = time.perf_counter()
    llm = load_llama(model_config, max_total_len(requests), threads)
    startup = time.perf_counter() - start
    start, output_tokens = time.perf_counter(), 0
    for request in requests:
        output_tokens += len(_generate(llm, request, temperature))
    elapsed = time.perf_counter() - start
    input_tokens = sum(r.prompt_len for r in requests)
    return ThroughputResult(
        "llama.cpp", len(requests), input_tokens, output_tokens, elapsed, startup
    )


def llamacpp_latency_sample(llm: "Llama", request: BenchRequest) -> LatencySample:
    """One greedy run of a single request (llama-cpp-python's Llama has one sequence)."""
    start = time.perf_counter()
    times = _generate(llm, request, 0.0)
    return latency_sample([times[0] - start], [times[-1] - start], request.output_len)
