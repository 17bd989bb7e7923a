"""The llama.cpp peer, through llama-cpp-python when it is importable (an optional extra).

It runs the same weights as pagedllm: the GGUF file itself when pagedllm runs it quantized
(the default for a GGUF, e.g. the default model's Q4_1), or an F32 copy of it (cached, see
gguf_copy.py) when pagedllm dequantizes it at load (`--quantization none`), so that both do
float32 arithmetic. It uses torch's thread count. llama-cpp-python's `Llama` holds one
sequence, so requests run one after another: prompt in one eval, then one token per eval.
"""

import importlib.util
import time
from typing import TYPE_CHECKING

from pagedllm.benchmarks.datasets import BenchRequest, max_total_len
from pagedllm.benchmarks.gguf_copy import F32, gguf_copy_path
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


def require_llama_cpp() -> None:
    if importlib.util.find_spec("llama_cpp") is None:
        raise BackendUnavailable(SKIP_MESSAGE)


def llamacpp_model_path(model_config: ModelConfig) -> str:
    """The GGUF llama.cpp runs: pagedllm's own file when pagedllm runs its tensors as stored
    (quantization "gguf"), else (dequantized at load) an F32 copy, for the same arithmetic."""
    source = model_config.gguf_file
    if source is None:
        raise BackendUnavailable(
            f"skipped: llama.cpp needs a GGUF model, {model_config.model!r} is a HF folder "
            "(convert it with llama.cpp's convert_hf_to_gguf.py --outtype f32)"
        )
    return source if model_config.quantization == "gguf" else gguf_copy_path(source, F32)


def load_llama(model_config: ModelConfig, n_ctx: int, threads: int) -> "Llama":
    require_llama_cpp()
    from llama_cpp import Llama

    return Llama(
        model_path=llamacpp_model_path(model_config),
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
