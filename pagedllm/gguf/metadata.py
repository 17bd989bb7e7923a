"""A GGUF file's metadata values of the type an architecture needs.

GGUF stores any type under any key, and a hand-edited or broken file can hold a zero head
count, a string layer count or an array where a number belongs. Each value is checked where it
is read, so a bad one is a ValueError naming the file, the key and the value, not a
ZeroDivisionError or transformers' config validation far from the cause.
"""

import math
from typing import Any

from pagedllm.gguf.reader import GGUFFile

_REQUIRED = object()


def required(gguf: GGUFFile, key: str) -> Any:
    """The metadata value at `key`, which the file's architecture needs; ValueError if absent."""
    if key not in gguf.metadata:
        raise ValueError(f"{gguf.path} has no metadata key {key!r}, which its architecture needs")
    return gguf.metadata[key]


def integer(gguf: GGUFFile, key: str, default: Any = _REQUIRED, minimum: int = 1) -> int:
    """The integer at `key` (`default` where absent, required if none), at least `minimum`."""
    value = _value(gguf, key, default)
    if not _is_number(value) or isinstance(value, float) or value < minimum:
        raise _bad(gguf, key, value, f"an integer >= {minimum}")
    return value


def positive_float(gguf: GGUFFile, key: str, default: Any = _REQUIRED) -> float:
    """The finite number above 0 at `key` (`default` where absent, required if none)."""
    value = _value(gguf, key, default)
    if not _is_number(value) or not math.isfinite(value) or value <= 0:
        raise _bad(gguf, key, value, "a finite number > 0")
    return float(value)


def string(gguf: GGUFFile, key: str, default: Any = _REQUIRED) -> str:
    value = _value(gguf, key, default)
    if not isinstance(value, str):
        raise _bad(gguf, key, value, "a string")
    return value


def _value(gguf: GGUFFile, key: str, default: Any) -> Any:
    if default is _REQUIRED:
        return required(gguf, key)
    return gguf.metadata.get(key, default)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _bad(gguf: GGUFFile, key: str, value: Any, allowed: str) -> ValueError:
    return ValueError(f"{gguf.path}: metadata key {key!r} is {value!r}; it must be {allowed}")
