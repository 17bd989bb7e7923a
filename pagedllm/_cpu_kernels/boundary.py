"""Each kernel of pagedllm._C declared once, as the table of its binding's arguments, and its
launches.

A binding takes raw data pointers, ints and floats in a fixed order, so a wrong tensor (another
dtype, a strided view, swapped arguments) reads or writes arbitrary memory. A `Kernel` lists
its binding's arguments in order, each named and of one kind: `Tensor` (an input's data
pointer: its dtype, rank and layout), `Output` (the data pointer of memory the wrapper
allocated), `Int`, `Flag` (an enum of flags.py) or `Float`. From that table come

- the wrapper's checks of its input tensors (`Kernel.check`, `Kernel.check_shape`), which raise
  ValueError naming the argument;
- the call's packing (`Kernel.launch`): each tensor's data pointer (0 for a missing optional
  one), each flag checked to be of its enum, ints and floats as they are (the binding raises
  TypeError naming one of the wrong type);
- the binding's signature, "name:kind ..." (kind p, i or f), which __init__.py compares with
  the one pagedllm._C reports for each binding when it loads;
- the positions of the data pointers among the packed arguments, which every recorded
  `Launch` carries for executor/launch_memory.py.

`Kernel.check` and `Kernel.launch` are written out as straight-line code once per
declaration (`_compile`), so a call costs what a hand-written wrapper would: the wrappers run
~300 times per decode step (a tiny call's Python time, `_C` stubbed out, within noise of
hand-written checks and calls).
"""

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import IntEnum
from typing import NamedTuple, NoReturn

import torch

from pagedllm import _cpu_kernels as package
from pagedllm._cpu_kernels.flags import ISA_BEST
from pagedllm.tensor_layout import rows_dense

_F32, _BF16 = torch.float32, torch.bfloat16
ANY_RANK = ()
"""A Tensor's ranks: one dimension or more."""


class Launch(NamedTuple):
    """One kernel call: the binding, its packed arguments, and which of them are pointers."""

    run: Callable[..., None]
    args: tuple[int | float, ...]
    pointers: tuple[int, ...]
    """Indices of args that are data pointers (0 for a missing optional tensor)."""


class _Recording(threading.local):
    launches: list[Launch] | None = None


_recording = _Recording()


@contextmanager
def record_launches() -> Iterator[list[Launch]]:
    """Yields a list to which this thread's kernel launches are appended until the block
    ends (they still run). Not nested."""
    if _recording.launches is not None:
        raise RuntimeError("record_launches() is already active in this thread")
    _recording.launches = launches = []
    try:
        yield launches
    finally:
        _recording.launches = None


def replay_launches(launches: list[Launch]) -> None:
    """Runs recorded launches again, in order. Their pointers must still be valid: the caller
    keeps every tensor they point into alive. The bindings' index checks run as before."""
    for run, args, _ in launches:
        run(*args)


def float_dtype(t: object) -> torch.dtype:
    """t's dtype when the kernels take it (float32 or bfloat16), else float32, for a check
    to name in its error."""
    dtype = getattr(t, "dtype", None)
    return dtype if dtype is _BF16 else _F32


def describe(t: object) -> str:
    if not isinstance(t, torch.Tensor):
        return f"{type(t).__name__} {t!r:.80}"
    layout = "contiguous" if t.is_contiguous() else f"strides {t.stride()}"
    return f"{str(t.dtype)[6:]} {t.device} tensor of shape {list(t.shape)} ({layout})"


def require(op: str, ok: bool, message: str, *args: object) -> None:
    """Raises ValueError(op: message.format(*args)) unless ok; formats only then."""
    if not ok:
        raise ValueError(f"{op}: " + message.format(*args))


def _ranks(dims: str, rank: int | tuple[int, ...] | None) -> tuple[int, ...]:
    """The ranks a Tensor takes: rank's, else those of dims "[a, b, ...]" ("[..., n]": any)."""
    if rank is not None:
        return (rank,) if isinstance(rank, int) else rank
    assert dims.startswith("["), f"give the rank of dims {dims!r}"
    inside = dims[1 : dims.index("]")]
    return ANY_RANK if inside.startswith("...") else (inside.count(",") + 1,)


class Tensor:
    """An input tensor's data pointer: a CPU tensor of `dtype`, contiguous (or, with rows,
    dense row by row, rows_dense), of the rank of `dims` (or `rank`: an int or a tuple of the
    ranks it may have). dtype is a torch.dtype, or the name of a group of the kernel's
    tensors that are all float32 or all bfloat16, as the first of them is. optional: None
    stands for no tensor (pointer 0). `dims` names the dimensions for the error message."""

    kind = "p"

    def __init__(
        self,
        name: str,
        dims: str,
        dtype: torch.dtype | str,
        *,
        rank: int | tuple[int, ...] | None = None,
        rows: bool = False,
        optional: bool = False,
    ) -> None:
        self.name, self.dims, self.dtype = name, dims, dtype
        self.ranks, self.rows, self.optional = _ranks(dims, rank), rows, optional

    def condition(self, dtype: str) -> str:
        """Python source: whether the tensor `self.name` is as declared, of dtype `dtype` (an
        expression)."""
        t = self.name
        ranks = self.ranks
        if len(ranks) == 1:
            rank = f"{t}.dim() == {ranks[0]}"
        else:
            rank = f"{t}.dim() in {ranks}" if ranks else f"{t}.dim() > 0"
        layout = f"_rows_dense({t})" if self.rows else f"{t}.is_contiguous()"
        ok = f"isinstance({t}, _Tensor) and {t}.dtype is {dtype} and {t}.is_cpu and {rank}"
        return f"{t} is None or {ok} and {layout}" if self.optional else f"{ok} and {layout}"

    def message(
        self, op: str, t: object, dtype: torch.dtype, shape: tuple[int, ...] = (), dims: str = ""
    ) -> str:
        layout = "row-dense" if self.rows else "contiguous"
        sizes = f" = {list(shape)}" if shape else ""
        return (
            f"{op}: {self.name} must be a {layout} {str(dtype)[6:]} CPU tensor of shape "
            f"{dims or self.dims}{sizes}, got {describe(t)}"
        )


class _Named:
    """An argument the declaration knows by name and kind only."""

    kind = ""

    def __init__(self, name: str) -> None:
        self.name = name


class Output(_Named):
    """The data pointer of a tensor the wrapper allocated (not checked)."""

    kind = "p"


class Int(_Named):
    """An int: a size, stride, count or index (the binding raises TypeError for another type)."""

    kind = "i"


class Float(_Named):
    """A float (the binding raises TypeError for another type)."""

    kind = "f"


class Flag(_Named):
    """A flag: a member of `enum` (flags.py), passed to C as its int."""

    kind = "i"

    def __init__(self, name: str, enum: type[IntEnum]) -> None:
        super().__init__(name)
        self.enum = enum


Arg = Tensor | Output | Int | Flag | Float


def _compile(lines: list[str], namespace: dict[str, object]) -> Callable[..., None]:
    """The function `plan` that lines define, its globals `namespace`. A declaration's checks
    and launch are written out as code once, as dataclasses writes a class's __init__, so
    that a call runs straight-line code: no loop or lookup over the declared arguments."""
    exec("\n".join(lines) + "\n", namespace)
    return namespace["plan"]


def checks(op: str, *tensors: Tensor) -> Callable[..., None]:
    """A function of the tensors' values, in order, that raises ValueError naming the first
    one that is not as declared: the checks of `op`'s inputs."""
    lines = [f"def plan({', '.join(t.name for t in tensors)}):"]
    namespace: dict[str, object] = {"_Tensor": torch.Tensor, "_rows_dense": rows_dense}
    namespace["_float_dtype"] = float_dtype
    groups: set[str] = set()
    for i, t in enumerate(tensors):
        dtype = f"_dtype{i}"
        if type(t.dtype) is str:
            dtype = f"_group_{t.dtype}"
            if t.dtype not in groups:  # the group's first tensor sets its dtype
                assert not t.optional, f"{op}: the first {t.dtype} tensor is optional"
                groups.add(t.dtype)
                lines.append(f"    {dtype} = _float_dtype({t.name})")
        namespace |= {f"_dtype{i}": t.dtype, f"_spec{i}": t}
        lines.append(f"    if not ({t.condition(dtype)}):")
        lines.append(f"        raise ValueError(_spec{i}.message({op!r}, {t.name}, {dtype}))")
    return _compile(lines, namespace)


def _flag_error(kernel: "Kernel", i: int, value: object) -> NoReturn:
    arg = kernel.args[i]
    assert isinstance(arg, Flag)
    raise TypeError(f"{kernel.name}: {arg.name} must be a {arg.enum.__name__}, got {value!r}")


KERNELS: dict[str, "Kernel"] = {}
"""Every declared kernel by name: what pagedllm._C's signatures() must match."""


class Kernel:
    """The binding pagedllm._C.<name> and its arguments, in order. Its plan, made once:

    - check(*tensors): the checks of the Tensor arguments, given in order;
    - launch(*values): the call on one value per argument, in order (tensors, None for a
      missing optional one, ints, flags, floats): flags checked to be of their enum, each
      tensor's data pointer taken (0 for None), recorded within record_launches()."""

    def __init__(self, name: str, *args: Arg) -> None:
        assert name not in KERNELS, f"{name} is declared twice"
        assert all(arg.name.isidentifier() and arg.name[0] != "_" for arg in args), name
        KERNELS[name] = self
        self.name, self.args = name, args
        self.signature = " ".join(f"{arg.name}:{arg.kind}" for arg in args)
        self.pointers = tuple(i for i, arg in enumerate(args) if arg.kind == "p")
        inputs = [arg for arg in args if isinstance(arg, Tensor)]
        self._tensors = {arg.name: arg for arg in inputs}
        self.check = checks(name, *inputs)
        self.launch = self._plan_launch()

    def check_shape(
        self, name: str, t: torch.Tensor, shape: tuple[int, ...], dims: str = ""
    ) -> None:
        """Raises ValueError unless input `name`, t (checked), is of exactly shape; the
        message names `dims` (the declared ones by default) = shape."""
        if t.shape != shape:
            raise ValueError(self._tensors[name].message(self.name, t, t.dtype, shape, dims))

    def _plan_launch(self) -> Callable[..., None]:
        lines = [f"def plan({', '.join(arg.name for arg in self.args)}):"]
        namespace: dict[str, object] = {"_kernel": self, "_flag_error": _flag_error}
        packed = []
        for i, arg in enumerate(self.args):
            if isinstance(arg, Flag):
                namespace[f"_enum{i}"] = arg.enum
                lines.append(f"    if type({arg.name}) is not _enum{i}:")
                lines.append(f"        _flag_error(_kernel, {i}, {arg.name})")
            pointer = f"{arg.name}.data_ptr()"
            if isinstance(arg, Tensor) and arg.optional:
                pointer = f"0 if {arg.name} is None else {pointer}"
            packed.append(pointer if arg.kind == "p" else arg.name)
        lines += [
            f"    _run = _package._C.{self.name}",
            f"    _args = ({', '.join(packed)},)",
            "    _launches = _recording.launches",
            "    if _launches is not None:",
            "        _launches.append(_Launch(_run, _args, _pointers))",
            "    _run(*_args)",
        ]
        namespace |= {"_package": package, "_recording": _recording, "_Launch": Launch}
        namespace["_pointers"] = self.pointers
        return _compile(lines, namespace)


def isa_index(op: str, isa: str | None, table: tuple[tuple[str, bool], ...]) -> int:
    """The kernel's index of isa, a name its table marks supported; ISA_BEST for None."""
    if isa is None:
        return ISA_BEST
    names = supported(table)
    require(op, isa in names, "isa {!r} is not one of this CPU's {}", isa, names)
    return [name for name, _ in table].index(isa)


def supported(table: tuple[tuple[str, bool], ...]) -> tuple[str, ...]:
    """The names of a table of builds ((name, supported), ...) that this CPU runs."""
    return tuple(name for name, ok in table if ok)


def isa_table(query: str) -> tuple[tuple[str, bool], ...]:
    """pagedllm._C.<query>(), a kernel's table of builds, best first; () without _C."""
    return getattr(package._C, query)() if package._C is not None else ()
