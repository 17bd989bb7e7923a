"""The paged KV cache: one tensor per model, a [k, v] pair of views per Attention layer."""

import math

import torch
from torch import nn

from pagedllm.config import EngineConfig
from pagedllm.cpu_memory import anonymous_map
from pagedllm.layers.attention import Attention
from pagedllm.logger import init_logger

logger = init_logger(__name__)


def attention_layers(model: nn.Module) -> list[Attention]:
    return [m for m in model.modules() if isinstance(m, Attention)]


def kv_cache_bytes_per_token(model: nn.Module, dtype: torch.dtype) -> int:
    """Bytes of K and V for one token across all layers on this rank."""
    per_layer = [2 * layer.num_kv_heads * layer.head_size for layer in attention_layers(model)]
    return sum(per_layer) * torch.empty((), dtype=dtype).element_size()


def zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Zeros; on CPU a private anonymous map, whose pages the OS maps on first write.

    A multi-GiB cache then costs nothing at start-up and only the memory it uses. It must
    be zeros, not empty: attention reads (and masks) unwritten slots, and 0 * NaN is NaN.
    The map opts out of transparent huge pages: the first write to each 2 MiB page can
    stall for ~10 ms while the OS zeroes it, making prefill's cache writes up to 8-10x
    slower than with 4 KiB pages.
    """
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    try:
        memory = anonymous_map(nbytes, huge_pages=False)
    except OSError as e:  # ENOMEM: past the kernel's overcommit limit
        raise ValueError(
            f"cannot map the KV cache's {nbytes / 1024**3:.2f} GiB ({e.strerror}); lower "
            "kv_cache_memory_bytes / num_kv_blocks"
        ) from e
    return memory.view(dtype).view(shape)


def bind_kv_cache(
    model: nn.Module,
    num_blocks: int,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device | str,
) -> torch.Tensor:
    """Allocate [2, layers, num_blocks, block_size, kv_heads, head_dim] and hand each
    Attention layer its (k_cache, v_cache) views."""
    layers = attention_layers(model)
    if not layers:
        raise ValueError("model has no Attention layers")
    shapes = {(layer.num_kv_heads, layer.head_size) for layer in layers}
    assert len(shapes) == 1, f"layers differ in kv shape: {shapes}"
    kv_heads, head_size = shapes.pop()
    shape = (2, len(layers), num_blocks, block_size, kv_heads, head_size)
    cache = zeros(shape, dtype, torch.device(device))
    for i, layer in enumerate(layers):
        layer.kv_cache = (cache[0, i], cache[1, i])
    return cache


CPU_MEMORY_FRACTION = 0.3
GPU_MEMORY_FRACTION = 0.8


def available_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free
    return _meminfo_bytes("MemAvailable")


def _meminfo_bytes(field: str) -> int:
    with open("/proc/meminfo") as f:
        fields = dict(line.split(":", 1) for line in f)
    return int(fields[field].split()[0]) * 1024


def check_cpu_kv_cache_fits(config: EngineConfig, cache_bytes: int) -> None:
    """A CPU cache whose pages the machine cannot hold is refused before it is mapped (the
    map itself succeeds up to the kernel's overcommit limit, and the process would be
    killed once the cache fills); one larger than the memory free now is a warning. The
    machine holds memory_sharers such caches (its ranks' and replicas')."""
    if torch.device(config.device).type != "cpu":
        return
    sharers = memory_sharers(config)
    total, gib = cache_bytes * sharers, 1024**3
    what = f"the KV cache ({total / gib:.2f} GiB" + (
        f" over {sharers} caches)" if sharers > 1 else ")"
    )
    machine = _meminfo_bytes("MemTotal")
    if total > machine:
        raise ValueError(
            f"{what} is larger than this machine's memory ({machine / gib:.2f} GiB); lower "
            "kv_cache_memory_bytes / num_kv_blocks"
        )
    free = _meminfo_bytes("MemAvailable")
    if total > free:
        logger.warning(
            "%s is larger than the memory free now (%.2f GiB): the process may be killed "
            "once the cache fills; lower kv_cache_memory_bytes / num_kv_blocks",
            what,
            free / gib,
        )


def default_kv_cache_bytes(
    device: torch.device, max_tokens_needed_bytes: int, sharers: int = 1
) -> int:
    """A share of free memory, split between the `sharers` caches that take it (a CPU's
    ranks and replicas: each measures the same free memory, and their pages are touched
    only as they fill), but never more than `max_tokens_needed_bytes`, what max_num_seqs
    sequences of max_model_len tokens could ever use."""
    fraction = GPU_MEMORY_FRACTION if device.type == "cuda" else CPU_MEMORY_FRACTION
    share = available_memory_bytes(device) * fraction / sharers
    return min(int(share), max_tokens_needed_bytes)


def memory_sharers(config: EngineConfig) -> int:
    """How many KV caches of this size one machine's memory holds: on a CPU each rank of
    this node and each data-parallel replica on it has its own; a GPU's is its own."""
    if torch.device(config.device).type == "cuda":
        return 1
    return config.parallel_config.ranks_per_node * config.cache_config.node_replicas


def profiles_gpu_memory(config: EngineConfig) -> bool:
    """Whether the cache's size comes from a profile of the GPU's memory (gpu_memory.py):
    on CUDA, no size given, one pipeline stage (a stage's profile would need the stage
    before's output; with several the share of free memory is used)."""
    cache = config.cache_config
    return (
        torch.device(config.device).type == "cuda"
        and cache.num_kv_blocks is None
        and cache.kv_cache_memory_bytes is None
        and config.parallel_config.pipeline_parallel_size == 1
    )


def num_kv_blocks(
    config: EngineConfig, bytes_per_token: int, available_bytes: int | None = None
) -> int:
    """The cache's size in blocks: num_kv_blocks exactly, else kv_cache_memory_bytes, else
    `available_bytes` (what gpu_memory_utilization leaves it, when profiled), else a share
    of free memory; never more than max_num_seqs full sequences need, and at least one
    max_model_len sequence. Logs the choice."""
    cache, block_size = config.cache_config, config.cache_config.block_size
    max_len = config.model_config.max_model_len
    num_blocks = cache.num_kv_blocks
    if num_blocks is None:
        most = config.scheduler_config.max_num_seqs * (max_len + block_size) * bytes_per_token
        if cache.kv_cache_memory_bytes:
            budget = cache.kv_cache_memory_bytes
        elif available_bytes is not None:
            budget = min(max(0, available_bytes), most)
        else:
            device, sharers = torch.device(config.device), memory_sharers(config)
            budget = default_kv_cache_bytes(device, most, sharers)
        num_blocks = budget // (bytes_per_token * block_size)
    num_tokens = num_blocks * block_size
    if num_tokens < max_len:
        more = "kv_cache_memory_bytes / num_kv_blocks"
        if available_bytes is not None and not cache.kv_cache_memory_bytes:
            more = (
                f"gpu_memory_utilization (now {cache.gpu_memory_utilization}), or lower "
                "max_num_batched_tokens / max_num_seqs (the profiled step's size)"
            )
        raise ValueError(
            f"the KV cache holds {num_blocks} blocks x {block_size} = {num_tokens} tokens, "
            f"fewer than max_model_len={max_len}; lower max_model_len or give more {more}"
        )
    check_cpu_kv_cache_fits(config, num_tokens * bytes_per_token)
    size = num_tokens * bytes_per_token / 1024**3
    world = config.parallel_config.world_size
    gib = (
        f"{size:.2f} GiB"
        if world == 1
        else f"{size:.2f} GiB a rank, at most {size * world:.2f} GiB over its {world} ranks"
    )
    logger.info(
        "KV cache: %d blocks x %d tokens = %d tokens (%s); max concurrency at "
        "max_model_len %d: %.2fx",
        num_blocks,
        block_size,
        num_tokens,
        gib,
        max_len,
        num_tokens / max_len,
    )
    return num_blocks
