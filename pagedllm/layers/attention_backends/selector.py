"""Which attention backend runs, from the device and dtype the model is built for.

The candidates below are tried in order and the first whose `supports(device, dtype)` holds
is used; the torch reference runs wherever none does. A CUDA (flash-attn) or Triton backend
joins by implementing `AttentionBackend` and adding its class here, ahead of those it beats.
"""

import torch

from pagedllm.layers.attention_backends.backend import AttentionBackend
from pagedllm.layers.attention_backends.cpu import CpuAttentionBackend
from pagedllm.layers.attention_backends.torch_sdpa import TorchSdpaBackend

_CANDIDATES: tuple[type[AttentionBackend], ...] = (CpuAttentionBackend,)


def get_attn_backend(device: torch.device | str, dtype: torch.dtype) -> AttentionBackend:
    device = torch.device(device)
    for backend in _CANDIDATES:
        if backend.supports(device, dtype):
            return backend()
    return TorchSdpaBackend()
