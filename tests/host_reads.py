"""A check that code reads no tensor on the host: on an accelerator each such read (a
`.tolist()`, `.item()`, `bool(t)`, a `nonzero`) makes the host wait for the device. Run on
CPU tensors, NoHostReads stands in for the device: it raises on any such call until
`allow()` (the code's one deliberate transfer) is called."""

import torch
from torch.overrides import TorchFunctionMode

_READS = frozenset(
    {
        "tolist",
        "item",
        "__bool__",
        "__int__",
        "__float__",
        "__index__",
        "cpu",
        "numpy",
        "nonzero",
        "masked_select",
        "unique",
        "unique_consecutive",
        "repeat_interleave",
    }
)


class NoHostReads(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.allowed = False

    def allow(self) -> None:
        self.allowed = True

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        name = getattr(func, "__name__", "")
        if not self.allowed and (name in _READS or _bool_index(name, args)):
            raise AssertionError(f"{name} reads a tensor on the host")
        return func(*args, **(kwargs or {}))


def _bool_index(name: str, args: tuple) -> bool:
    """x[mask] with a bool tensor: its size comes from the host (a nonzero)."""
    if name not in ("__getitem__", "__setitem__") or len(args) < 2:
        return False
    index = args[1] if isinstance(args[1], tuple) else (args[1],)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in index)
