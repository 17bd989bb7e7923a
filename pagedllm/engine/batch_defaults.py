"""A step's default size (max_num_batched_tokens, max_num_seqs) by device and entry point,
as vLLM's EngineArgs.get_batch_defaults: where the user sets neither, the offline `LLM` gets
large steps (throughput), the OpenAI server smaller ones (each step's latency), and a GPU
with room for them (>= 70 GiB, not an A100) larger ones still.

On a CPU both entry points keep 2048 tokens over 256 sequences, the sizes the CPU figures
in BENCHMARKS.md are measured with.
"""

import enum

import torch

GiB = 1 << 30


class UsageContext(enum.Enum):
    """vLLM's names for who builds the engine."""

    LLM_CLASS = "LLM_CLASS"
    OPENAI_API_SERVER = "OPENAI_API_SERVER"


CPU_DEFAULTS = (2048, 256)
# vLLM's: (max_num_batched_tokens, max_num_seqs). An A100 is left out of the large class
# because large steps lowered its throughput (vLLM's PR #17885).
LARGE_GPU_DEFAULTS = {
    UsageContext.LLM_CLASS: (16384, 1024),
    UsageContext.OPENAI_API_SERVER: (8192, 1024),
}
GPU_DEFAULTS = {UsageContext.LLM_CLASS: (8192, 256), UsageContext.OPENAI_API_SERVER: (2048, 256)}
LARGE_GPU_MEMORY = 70 * GiB


def default_batch_limits(device: str, usage_context: UsageContext) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) for an engine on `device` built by
    `usage_context`, where the user sets neither."""
    if torch.device(device).type != "cuda":
        return CPU_DEFAULTS
    name, memory = _gpu(device)
    large = memory >= LARGE_GPU_MEMORY and "a100" not in name.lower()
    return (LARGE_GPU_DEFAULTS if large else GPU_DEFAULTS)[usage_context]


def _gpu(device: str) -> tuple[str, int]:
    """The GPU's name and total memory in bytes; ("", 0) where torch cannot tell (vLLM's
    fallback: the smaller defaults)."""
    try:
        props = torch.cuda.get_device_properties(torch.device(device))
    except (RuntimeError, AssertionError, ValueError):
        return "", 0
    return props.name, props.total_memory
