"""The batch-1 decode bound: memory read bandwidth over the bytes of weights read per token.

At batch 1 every decode step reads every weight once and does little arithmetic per byte,
so no implementation can beat bandwidth / weight bytes tokens per second (KV reads and
activations only lower the bound further). A GGUF run as stored (quantization "gguf") reads
its tensors' bytes as they lie in the file; otherwise the weights are the model's parameters
in its dtype.
"""

import time

import torch

from pagedllm.config import ModelConfig
from pagedllm.model_loader.loader import build_model, weight_bytes


def measure_read_bandwidth(num_bytes: int = 512 * 1024**2, repeats: int = 10) -> float:
    """Bytes per second that `torch.sum` streams through a float32 tensor of `num_bytes`,
    best of `repeats`, with torch's current thread count."""
    if num_bytes < 4 or repeats < 1:
        raise ValueError(f"num_bytes {num_bytes} must be >= 4 and repeats {repeats} >= 1")
    data = torch.ones(num_bytes // 4, dtype=torch.float32)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.sum(data)
        best = min(best, time.perf_counter() - start)
    return data.numel() * 4 / best


def model_weight_bytes(model_config: ModelConfig) -> int:
    """The bytes one decode step must read: the model's parameters as it holds them, built
    on the meta device (no memory) with each layer's quant method, so a GGUF run as stored
    counts its blocks and anything dequantized counts in its dtype."""
    return weight_bytes(build_model(model_config, "meta"), buffers=False)


def decode_bound_tokens_per_s(bandwidth: float, model_bytes: int, batch_size: int = 1) -> float:
    """Tokens/s if each step only streamed the weights once for the whole batch."""
    return batch_size * bandwidth / model_bytes
