"""Which attention backend runs: the one named in the engine's config, else the best for
the device and dtype the model is built for.

By name (`attention_backend`, vLLM's names: LLM(..., attention_backend=...),
--attention-backend, PAGEDLLM_ATTENTION_BACKEND): TRITON_ATTN (Triton kernels: CUDA, or
CPU tensors under Triton's interpreter), CPU_ATTN (pagedllm._C's kernels) or TORCH_SDPA (the
torch reference). A name whose backend cannot run the device and dtype is a ValueError
naming those that can. The model runner names it for the layers it builds
(`use_attn_backend` around the model's construction), so no layer reads the environment.

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


@contextmanager
def use_attn_backend(name: str | None) -> Iterator[None]:
    """Layers built inside get backend `name` (None: the default choice)."""
    global _named
    previous, _named = _named, name
    try:
        yield
    finally:
        _named = previous


def get_attn_backend(device: torch.device | str, dtype: torch.dtype) -> AttentionBackend:
    device = torch.device(device)
    if _named is not None:
        chosen = check_attn_backend(_named, device, dtype)
    else:
        chosen = next(
            (
                b
                for b, device_types in _CANDIDATES
                if device.type in device_types and b.supports(device, dtype)
            ),
            TorchSdpaBackend,
        )
    _log_once(chosen, device, dtype)
    return chosen()


def check_attn_backend(
    name: str, device: torch.device | str, dtype: torch.dtype
) -> type[AttentionBackend]:
    """The backend called `name`, if it runs `dtype` on `device`; else a ValueError naming
    the backends that do."""
    device = torch.device(device)
    if name not in BACKENDS:
        raise ValueError(f"attention backend {name!r} is not one of {', '.join(BACKENDS)}")
    backend = BACKENDS[name]
    if not backend.supports(device, dtype):
        usable = [n for n, b in BACKENDS.items() if b.supports(device, dtype)]
        raise ValueError(
            f"attention backend {name} cannot run {dtype} on {device.type}: it needs "
            f"{backend.requirement}; here use one of {', '.join(usable)}"
        )
    return backend


_logged: set[tuple[str, str, torch.dtype]] = set()


def _log_once(backend: type[AttentionBackend], device: torch.device, dtype: torch.dtype) -> None:
    key = (backend.name, device.type, dtype)
    if key in _logged:
        return
    _logged.add(key)
    others = [b.name for b, types in _CANDIDATES if device.type in types and b is not backend]
    why = (
        f" ({', '.join(others)} not for {device.type} {dtype})"
        if backend is TorchSdpaBackend and _named is None
        else ""
    )
    logger.info("attention backend: %s%s", backend.name, why)
