"""device_copy (pagedllm/device_copy.py): the values arrive as torch.tensor would make
them, on the CPU without a copy, and to_host waits once for every copy it starts."""

import pytest
import torch

from pagedllm.device_copy import copy_to_host, tensor_to_device, to_device, to_host
from tests.devices import DEVICES


@pytest.mark.parametrize("device", DEVICES)
def test_values_arrive_with_their_dtype(device: str) -> None:
    device = torch.device(device)
    ids = to_device([[1, 2], [3, 4]], torch.int64, device)
    assert ids.device.type == device.type and ids.dtype == torch.int64
    assert ids.tolist() == [[1, 2], [3, 4]]
    host = torch.arange(5, dtype=torch.float32)
    moved = tensor_to_device(host, device)
    assert moved.device.type == device.type and moved.tolist() == host.tolist()
    assert (moved is host) == (device.type == "cpu")


@pytest.mark.parametrize("device", DEVICES)
def test_to_host_brings_every_tensor_back(device: str) -> None:
    tensors = [torch.arange(4, device=device), torch.ones(2, 3, device=device)]
    back = to_host(tensors)
    assert [t.device.type for t in back] == ["cpu", "cpu"]
    assert back[0].tolist() == [0, 1, 2, 3] and back[1].sum().item() == 6
    if device == "cpu":
        assert all(a is b for a, b in zip(back, tensors, strict=True))


@pytest.mark.parametrize("device", DEVICES)
def test_copy_to_host_waits_when_asked(device: str) -> None:
    """copy_to_host starts the copies; wait() gives them on the host (every call the same
    tensors); on the CPU the tensors themselves."""
    tensors = [torch.arange(3, device=device) * 2]
    copies = copy_to_host(tensors)
    later = torch.ones(1000, 1000, device=device) @ torch.ones(1000, 1000, device=device)
    back = copies.wait()
    assert back[0].device.type == "cpu" and back[0].tolist() == [0, 2, 4]
    assert copies.wait() is back and later.shape == (1000, 1000)
    assert (back[0] is tensors[0]) == (device == "cpu")
