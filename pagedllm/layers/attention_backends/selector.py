"""Which attention backend runs, from the device and dtype the model is built for.

The candidates below are tried in order and the first whose `supports(device, dtype)` holds
is used; the torch reference runs wherever none does. The choice is final: a backend runs its
own ops for every call. Which one a process runs, and why not a kernel backend, is logged
once. A CUDA (flash-attn) or Triton backend joins by implementing `AttentionBackend` and
adding its class here, ahead of those it beats.
"""

import torch

from pagedllm.layers.attention_backends.backend import AttentionBackend
from pagedllm.layers.attention_backends.cpu import CpuAttentionBackend
from pagedllm.layers.attention_backends.torch_sdpa import TorchSdpaBackend
from pagedllm.logger import init_logger

logger = init_logger(__name__)

_CANDIDATES: tuple[type[AttentionBackend], ...] = (CpuAttentionBackend,)


def get_attn_backend(device: torch.device | str, dtype: torch.dtype) -> AttentionBackend:
    device = torch.device(device)
    chosen = next((b for b in _CANDIDATES if b.supports(device, dtype)), TorchSdpaBackend)
    _log_once(chosen, device, dtype)
    return chosen()


_logged: set[tuple[str, str, torch.dtype]] = set()


def _log_once(backend: type[AttentionBackend], device: torch.device, dtype: torch.dtype) -> None:
    key = (backend.name, device.type, dtype)
    if key in _logged:
        return
    _logged.add(key)
    others = [b.name for b in _CANDIDATES if b is not backend]
    why = (
        f" ({', '.join(others)} not for {device.type} {dtype})"
        if backend is TorchSdpaBackend
        else ""
    )
    logger.info("attention backend: %s%s", backend.name, why)
