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


class HostCopies:
    """Device tensors on their way to the host: the copies are started into pinned memory
    without waiting, and `wait` waits once, for all of them (on the CPU: the tensors as
    they are). The wait is on an event recorded after the copies, not on the stream, so
    work queued after them (the next step, under async scheduling) is not waited for."""

    def __init__(self, tensors: Sequence[torch.Tensor]) -> None:
        devices = {t.device for t in tensors if t.device.type != "cpu"}
        self._tensors = [t.to("cpu", non_blocking=True) for t in tensors]
        self._events = []
        for device in devices:
            module = torch.get_device_module(device)
            event = module.Event()
            event.record(module.current_stream(device))
            self._events.append(event)

    def wait(self) -> list[torch.Tensor]:
        for event in self._events:
            event.synchronize()
        self._events = []
        return self._tensors


def copy_to_host(tensors: Sequence[torch.Tensor]) -> HostCopies:
    """Start copying the tensors to the host (HostCopies)."""
    return HostCopies(tensors)


def to_host(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The tensors on the CPU: device tensors are copied into pinned memory without waiting,
    then the host waits once, for all of them (the step's single device-to-host sync)."""
    return copy_to_host(tensors).wait()
