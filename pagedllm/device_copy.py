"""Host-device copies that never make the host wait for the device.

On an accelerator, `torch.tensor(values, device=cuda)` copies from pageable memory, which
synchronizes with the stream, and reading a device tensor on the host (`.tolist()`,
`.item()`) waits for every kernel before it. The step's inputs therefore travel from pinned
host memory with `non_blocking=True` (torch's caching host allocator keeps a pinned block
until its copy has run, so it is never rewritten early), and its results come back in one
batch of copies followed by a single wait. On the CPU each function is what the code did
without it: no pinning, no extra copy.
"""

from collections.abc import Sequence

import torch


def to_device(values: Sequence, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """torch.tensor(values, dtype) on `device`; off the CPU built in pinned memory and copied
    without waiting."""
    if device.type == "cpu":
        return torch.tensor(values, dtype=dtype)
    return torch.tensor(values, dtype=dtype, pin_memory=True).to(device, non_blocking=True)


def tensor_to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device`; off the CPU through pinned memory, without waiting."""
    if device.type == "cpu" or tensor.device == device:
        return tensor.to(device)
    if not tensor.is_pinned():
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)


def to_host(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The tensors on the CPU: device tensors are copied into pinned memory without waiting,
    then the host waits once, for all of them (the step's single device-to-host sync)."""
    devices = {t.device for t in tensors if t.device.type != "cpu"}
    if not devices:
        return list(tensors)
    copies = [t.to("cpu", non_blocking=True) for t in tensors]
    for device in devices:
        torch.get_device_module(device).current_stream(device).synchronize()
    return copies
