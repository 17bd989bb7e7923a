"""The paged KV cache (pagedllm/executor/kv_cache.py). Reference: its formulas: bytes per token
= 2 (K and V) x layers x kv_heads x head_size x element size; num_kv_blocks is taken as given,
else budget // (bytes_per_token x block_size), the budget being kv_cache_memory_bytes or a share
of free memory capped at what max_num_seqs sequences of max_model_len could use; the cache must
hold one max_model_len sequence."""

import dataclasses
import pathlib
from collections.abc import Callable

import pytest
import torch
from torch import nn

from pagedllm.config import EngineConfig
from pagedllm.engine.arg_utils import EngineArgs
from pagedllm.executor import kv_cache
from pagedllm.executor.kv_cache import bind_kv_cache, kv_cache_bytes_per_token, num_kv_blocks
from pagedllm.layers.attention import Attention
from tests.memory_maps import mapping_of, resident_bytes

BYTES_PER_TOKEN = 512
BLOCK_BYTES = BYTES_PER_TOKEN * 16


class TinyAttentionModel(nn.Module):
    """3 Attention layers (2 kv heads of 8), one nested, next to a layer that is not one."""

    def __init__(self, kv_heads: tuple[int, int, int] = (2, 2, 2)) -> None:
        super().__init__()
        self.first = Attention(4, 8, 0.5, kv_heads[0])
        self.proj = nn.Linear(2, 2)
        self.rest = nn.ModuleList(Attention(4, 8, 0.5, h) for h in kv_heads[1:])


@pytest.fixture
def engine_config(tiny_model_path: Callable[[str], str]) -> Callable[..., EngineConfig]:
    def make(**kwargs: object) -> EngineConfig:
        args = dict(dtype="float32", device="cpu", max_model_len=256, max_num_seqs=2) | kwargs
        return EngineArgs(tiny_model_path("llama-gqa-llama3"), **args).create_engine_config()

    return make


def test_bytes_per_token() -> None:
    """2 x 3 layers x 2 kv heads x 8 x 2 bytes (float16)."""
    assert kv_cache_bytes_per_token(TinyAttentionModel(), torch.float16) == 2 * 3 * 2 * 8 * 2


@pytest.mark.parametrize("blocks", [16, 17, 1000])
def test_num_kv_blocks_given_exactly(engine_config, blocks: int) -> None:
    assert num_kv_blocks(engine_config(num_kv_blocks=blocks), BYTES_PER_TOKEN) == blocks


def test_num_kv_blocks_from_a_memory_budget(engine_config) -> None:
    config = engine_config(kv_cache_memory_bytes=20 * BLOCK_BYTES + BLOCK_BYTES - 1)
    assert num_kv_blocks(config, BYTES_PER_TOKEN) == 20


@pytest.mark.parametrize(
    "free_blocks, expected",
    [(100, 30), (10_000, 34)],  # 0.3 of free memory; at most 2 x (256 + 16) tokens = 34 blocks
)
def test_num_kv_blocks_from_free_memory(engine_config, monkeypatch, free_blocks, expected) -> None:
    free = free_blocks * BLOCK_BYTES
    monkeypatch.setattr(kv_cache, "available_memory_bytes", lambda device: free)
    assert num_kv_blocks(engine_config(), BYTES_PER_TOKEN) == expected


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        (dict(tensor_parallel_size=2), 15),
        (dict(node_replicas=2), 15),
        (dict(pipeline_parallel_size=2, node_replicas=2), 7),
    ],
)
def test_a_cpus_ranks_and_replicas_split_its_share(
    engine_config, monkeypatch, kwargs: dict, expected: int
) -> None:
    """Each rank's (or replica's) cache is its own on one machine's memory: 0.3 of 100
    blocks' worth of free memory, over 2 or 4 of them."""
    free = 100 * BLOCK_BYTES
    monkeypatch.setattr(kv_cache, "available_memory_bytes", lambda device: free)
    replicas = kwargs.pop("node_replicas", 1)
    config = engine_config(max_model_len=64, max_num_seqs=64, **kwargs)
    config.cache_config.node_replicas = replicas
    assert num_kv_blocks(config, BYTES_PER_TOKEN) == expected


def fake_meminfo(monkeypatch, total_blocks: int, available_blocks: int) -> None:
    sizes = {"MemTotal": total_blocks * BLOCK_BYTES, "MemAvailable": available_blocks * BLOCK_BYTES}
    monkeypatch.setattr(kv_cache, "_meminfo_bytes", sizes.__getitem__)


@pytest.mark.parametrize(
    "kwargs", [dict(num_kv_blocks=101), dict(kv_cache_memory_bytes=101 * BLOCK_BYTES)]
)
def test_a_cpu_cache_larger_than_the_machine_is_refused(engine_config, monkeypatch, kwargs) -> None:
    """Refused before it is mapped: a map past the memory succeeds up to the kernel's
    overcommit limit, and the process dies once the cache fills."""
    fake_meminfo(monkeypatch, total_blocks=100, available_blocks=50)
    with pytest.raises(ValueError, match=r"larger than this machine's memory"):
        num_kv_blocks(engine_config(**kwargs), BYTES_PER_TOKEN)


def test_caches_of_a_machines_ranks_are_counted_together(engine_config, monkeypatch) -> None:
    fake_meminfo(monkeypatch, total_blocks=100, available_blocks=100)
    config = engine_config(num_kv_blocks=60, tensor_parallel_size=2)
    with pytest.raises(ValueError, match=r"over 2 caches\) is larger"):
        num_kv_blocks(config, BYTES_PER_TOKEN)


def test_a_cpu_cache_larger_than_free_memory_is_a_warning(
    engine_config, monkeypatch, caplog
) -> None:
    fake_meminfo(monkeypatch, total_blocks=100, available_blocks=50)
    assert num_kv_blocks(engine_config(num_kv_blocks=60), BYTES_PER_TOKEN) == 60
    assert "larger than the memory free now" in caplog.text


def test_a_cache_map_the_kernel_refuses_is_a_value_error(monkeypatch) -> None:
    def refuse(nbytes: int, huge_pages: bool) -> None:
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(kv_cache, "anonymous_map", refuse)
    with pytest.raises(ValueError, match=r"cannot map the KV cache's .*Cannot allocate memory"):
        kv_cache.zeros((2, 1024), torch.float32, torch.device("cpu"))


@pytest.mark.parametrize(
    "kwargs",
    [dict(num_kv_blocks=15), dict(kv_cache_memory_bytes=16 * BLOCK_BYTES - 1)],
    ids=["blocks", "bytes"],
)
def test_cache_that_cannot_hold_max_model_len_is_rejected(engine_config, kwargs) -> None:
    message = r"holds 15 blocks x 16 = 240 tokens, fewer than max_model_len=256"
    with pytest.raises(ValueError, match=message):
        num_kv_blocks(engine_config(**kwargs), BYTES_PER_TOKEN)


@pytest.mark.parametrize(
    "available_blocks, expected",
    [(20, 20), (10_000, 34)],  # at most 34 blocks, as above
)
def test_num_kv_blocks_from_a_gpu_profile(engine_config, available_blocks, expected) -> None:
    available = available_blocks * BLOCK_BYTES + BLOCK_BYTES - 1
    assert num_kv_blocks(engine_config(), BYTES_PER_TOKEN, available) == expected
    # A size given wins over the profile's.
    config = engine_config(kv_cache_memory_bytes=17 * BLOCK_BYTES)
    assert num_kv_blocks(config, BYTES_PER_TOKEN, available) == 17


@pytest.mark.parametrize("available", [15 * BLOCK_BYTES, -5 * 2**30])
def test_a_profile_leaving_too_little_names_gpu_memory_utilization(
    engine_config, available: int
) -> None:
    message = r"fewer than max_model_len=256; .*give more gpu_memory_utilization \(now 0.9\)"
    with pytest.raises(ValueError, match=message):
        num_kv_blocks(engine_config(), BYTES_PER_TOKEN, available)


def test_only_a_gpu_without_a_size_given_is_profiled(engine_config) -> None:
    config = engine_config()
    assert not kv_cache.profiles_gpu_memory(config)  # on the CPU
    gpu = dataclasses.replace(config, device="cuda")
    assert kv_cache.profiles_gpu_memory(gpu)
    for cache in (dict(num_kv_blocks=20), dict(kv_cache_memory_bytes=2**20)):
        sized = dataclasses.replace(gpu.cache_config, **cache)
        assert not kv_cache.profiles_gpu_memory(dataclasses.replace(gpu, cache_config=sized))
    stages = dataclasses.replace(gpu.parallel_config, pipeline_parallel_size=2)
    assert not kv_cache.profiles_gpu_memory(dataclasses.replace(gpu, parallel_config=stages))


def test_bind_kv_cache_gives_each_layer_views_of_one_zeroed_tensor() -> None:
    model = TinyAttentionModel()
    cache = bind_kv_cache(model, num_blocks=5, block_size=4, dtype=torch.float16, device="cpu")
    assert cache.shape == (2, 3, 5, 4, 2, 8) and cache.dtype == torch.float16
    assert cache.count_nonzero() == 0  # attention reads unwritten slots: zeros, not garbage
    layers = [model.first, *model.rest]
    cache[1, 2, 3] = 7.0
    cache[0, 0, 1] = 3.0
    for i, layer in enumerate(layers):
        k, v = layer.kv_cache
        assert k.shape == v.shape == (5, 4, 2, 8)
        torch.testing.assert_close(k, cache[0, i], rtol=0, atol=0)
        torch.testing.assert_close(v, cache[1, i], rtol=0, atol=0)
    assert layers[2].kv_cache[1][3].eq(7).all() and layers[0].kv_cache[0][1].eq(3).all()
    assert layers[1].kv_cache[1].count_nonzero() == 0


def test_bind_kv_cache_needs_attention_layers_of_one_shape() -> None:
    with pytest.raises(ValueError, match="model has no Attention layers"):
        bind_kv_cache(nn.Linear(2, 2), 4, 4, torch.float32, "cpu")
    with pytest.raises(AssertionError, match="layers differ in kv shape"):
        bind_kv_cache(TinyAttentionModel((2, 1, 2)), 4, 4, torch.float32, "cpu")


@pytest.mark.skipif(not pathlib.Path("/proc/self/smaps").exists(), reason="needs Linux /proc")
def test_cpu_cache_is_private_zeros_mapped_on_first_write() -> None:
    """Private, not shared memory (a fork must not share it; shmem is counted apart), out of
    transparent huge pages, and no memory until written: 64 MiB asked for, < 16 MiB
    resident."""
    before = resident_bytes()
    cache = kv_cache.zeros((2, 4, 1024, 16, 4, 64), torch.bfloat16, torch.device("cpu"))
    assert cache.shape == (2, 4, 1024, 16, 4, 64) and cache.is_contiguous()
    assert resident_bytes() - before < 16 * 2**20
    permissions, flags = mapping_of(cache.data_ptr())
    assert permissions == "rw-p"
    if pathlib.Path("/sys/kernel/mm/transparent_hugepage").exists():
        assert " nh" in flags  # MADV_NOHUGEPAGE
    cache[1, 3, 1023] = 2.0  # the last element is inside the map
    assert cache.count_nonzero() == 16 * 4 * 64
