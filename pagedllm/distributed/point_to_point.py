"""Point-to-point messages between pipeline stages over torch.distributed.

A message is a picklable object (its length, then its torch.save bytes, over a gloo group;
the tensors in it load onto the receiver's device) or a dict
of tensors (their names, shapes and dtypes as such a message, then each tensor over the
device group: gloo on CPU, NCCL on CUDA), vLLM's send_tensor_dict / recv_tensor_dict.

Sends do not wait for the receiver: a stage hands its micro-batch on and starts the next
one while the next stage computes. PendingSends keeps each send's tensors alive until it
completes; pairs of ranks receive in the order they were sent.
"""

import io

import torch
import torch.distributed as dist


class PendingSends:
    """The sends still in flight, with the tensors they read from."""

    def __init__(self) -> None:
        self._works: list[tuple[dist.Work, torch.Tensor]] = []

    def add(self, tensor: torch.Tensor, dst: int, group: dist.ProcessGroup) -> None:
        self._works = [(w, t) for w, t in self._works if not w.is_completed()]
        self._works.append((dist.isend(tensor, dst, group=group), tensor))

    def wait(self) -> None:
        for work, _ in self._works:
            work.wait()
        self._works.clear()


def dump_object(obj: object) -> torch.Tensor:
    """`obj` as the bytes a message carries [N] uint8."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return torch.frombuffer(bytearray(buffer.getbuffer()), dtype=torch.uint8)


def load_object(payload: torch.Tensor, device: torch.device | str = "cpu") -> object:
    """The object `dump_object` made `payload` of, its tensors on `device`."""
    return torch.load(
        io.BytesIO(payload.numpy().tobytes()), map_location=device, weights_only=False
    )


def send_object(obj: object, dst: int, group: dist.ProcessGroup, pending: PendingSends) -> None:
    """Send `obj` to global rank `dst` (a gloo group)."""
    payload = dump_object(obj)
    pending.add(torch.tensor([payload.numel()], dtype=torch.int64), dst, group)
    pending.add(payload, dst, group)


def recv_object(src: int, group: dist.ProcessGroup, device: torch.device | str = "cpu") -> object:
    """The next object global rank `src` sent this rank over `group`, its tensors on
    `device`."""
    size = torch.empty(1, dtype=torch.int64)
    dist.recv(size, src, group=group)
    payload = torch.empty(int(size.item()), dtype=torch.uint8)
    dist.recv(payload, src, group=group)
    return load_object(payload, device)


def send_tensor_dict(
    tensors: dict[str, torch.Tensor],
    dst: int,
    groups: tuple[dist.ProcessGroup, dist.ProcessGroup],
    pending: PendingSends,
) -> None:
    """groups: (cpu group for the metadata, device group for the tensors)."""
    cpu_group, device_group = groups
    metadata = [(name, t.shape, t.dtype) for name, t in tensors.items()]
    send_object(metadata, dst, cpu_group, pending)
    for tensor in tensors.values():
        pending.add(tensor.contiguous(), dst, device_group)


def recv_tensor_dict(
    src: int, groups: tuple[dist.ProcessGroup, dist.ProcessGroup], device: torch.device
) -> dict[str, torch.Tensor]:
    cpu_group, device_group = groups
    tensors = {}
    for name, shape, dtype in recv_object(src, cpu_group):
        tensors[name] = torch.empty(shape, dtype=dtype, device=device)
        dist.recv(tensors[name], src, group=device_group)
    return tensors
