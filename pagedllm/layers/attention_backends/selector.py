"""Which attention backend runs: the one named in the engine's config, else the best for
the device and dtype the model is built for.

By name (`attention_backend`, vLLM's names: LLM(..., attention_backend=...),
--attention-backend, PAGEDLLM_ATTENTION_BACKEND): TRITON_ATTN (Triton kernels: CUDA, or
CPU tensors under Triton's interpreter), CPU_ATTN (pagedllm._C's kernels) or TORCH_SDPA (the
torch reference). A name whose backend cannot run the device and dtype is a ValueError
naming those that can. The model runner names it, and the KV cache's dtype, for the layers
it builds (`use_attn_backend` around the model's construction), so no layer reads the
environment. A float8 KV cache (kv_cache_dtype="fp8") rules out the backends that cannot
read one (CPU_ATTN).

Unnamed, the candidates below are tried in order and the first whose
`supports(device, dtype)` holds is used; the torch reference runs wherever none does.
Triton is a candidate on CUDA only: on CPU tensors its interpreter is for tests, not speed.
The choice is final: a backend runs its own ops for every call. Which one a process runs,
and why not a kernel backend, is logged once.
"""

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from pagedllm.config import ATTENTION_BACKENDS
from pagedllm.layers.attention_backends.backend import AttentionBackend
from pagedllm.layers.attention_backends.cpu import CpuAttentionBackend
from pagedllm.layers.attention_backends.torch_sdpa import TorchSdpaBackend
from pagedllm.layers.attention_backends.triton_attn import TritonAttentionBackend
from pagedllm.logger import init_logger

logger = init_logger(__name__)

BACKENDS: dict[str, type[AttentionBackend]] = {
    b.name: b for b in (TritonAttentionBackend, CpuAttentionBackend, TorchSdpaBackend)
}
assert tuple(BACKENDS) == ATTENTION_BACKENDS, "config.ATTENTION_BACKENDS names these"

_CANDIDATES: tuple[tuple[type[AttentionBackend], tuple[str, ...]], ...] = (
    (TritonAttentionBackend, ("cuda",)),
    (CpuAttentionBackend, ("cpu",)),
)
"""(backend, device types it is chosen for unnamed), best first."""

_named: str | None = None
_kv_cache_dtype: torch.dtype | None = None


@contextmanager
def use_attn_backend(name: str | None, kv_cache_dtype: torch.dtype | None = None) -> Iterator[None]:
    """Layers built inside get backend `name` (None: the default choice), one that reads a
    KV cache of `kv_cache_dtype` (None: the model's dtype)."""
    global _named, _kv_cache_dtype
    previous = _named, _kv_cache_dtype
    _named, _kv_cache_dtype = name, kv_cache_dtype
    try:
        yield
    finally:
        _named, _kv_cache_dtype = previous


def get_attn_backend(device: torch.device | str, dtype: torch.dtype) -> AttentionBackend:
    device = torch.device(device)
    if _named is not None:
        chosen = check_attn_backend(_named, device, dtype, _kv_cache_dtype)
    else:
        chosen = next(
            (
                b
                for b, device_types in _CANDIDATES
                if device.type in device_types and _runs(b, device, dtype, _kv_cache_dtype)
            ),
            TorchSdpaBackend,
        )
    _log_once(chosen, device, dtype)
    return chosen()


def check_attn_backend(
    name: str,
    device: torch.device | str,
    dtype: torch.dtype,
    kv_cache_dtype: torch.dtype | None = None,
) -> type[AttentionBackend]:
    """The backend called `name`, if it runs `dtype` on `device` over a KV cache of
    `kv_cache_dtype`; else a ValueError naming the backends that do."""
    device = torch.device(device)
    if name not in BACKENDS:
        raise ValueError(f"attention backend {name!r} is not one of {', '.join(BACKENDS)}")
    backend = BACKENDS[name]
    if not _runs(backend, device, dtype, kv_cache_dtype):
        usable = [n for n, b in BACKENDS.items() if _runs(b, device, dtype, kv_cache_dtype)]
        needs = backend.requirement
        if backend.supports(device, dtype):
            needs = f"a KV cache it can read, not {kv_cache_dtype}"
        raise ValueError(
            f"attention backend {name} cannot run {dtype} on {device.type}: it needs "
            f"{needs}; here use one of {', '.join(usable)}"
        )
    return backend


def _runs(
    backend: type[AttentionBackend],
    device: torch.device,
    dtype: torch.dtype,
    kv_cache_dtype: torch.dtype | None,
) -> bool:
    fp8 = kv_cache_dtype is not None and kv_cache_dtype.itemsize == 1
    return backend.supports(device, dtype) and (backend.reads_fp8_kv_cache or not fp8)


_logged: set[tuple[str, str, torch.dtype]] = set()


def _log_once(backend: type[AttentionBackend], device: torch.device, dtype: torch.dtype) -> None:
    key = (backend.name, device.type, dtype)
    if key in _logged or device.type == "meta":  # a model sized, not run (inspect)
        return
    _logged.add(key)
    others = [b.name for b, types in _CANDIDATES if device.type in types and b is not backend]
    why = (
        f" ({', '.join(others)} not for {device.type} {dtype})"
        if others and backend is TorchSdpaBackend and _named is None
        else ""
    )
    logger.info("attention backend: %s%s", backend.name, why)
