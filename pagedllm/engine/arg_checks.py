"""Checks of EngineArgs' values where they enter (LLM(...), the CLI): each field's type, read
from its annotation, and vLLM's hub arguments, which a pagedllm that downloads nothing can
only refuse. A bad value is a TypeError or ValueError that names the argument, not an error
from deep inside the engine (`'<=' not supported between int and str`)."""

import os
from dataclasses import Field
from types import NoneType
from typing import get_args

import torch

from pagedllm.value_checks import as_float, as_int

_TYPE_NAMES = {
    bool: "a bool",
    int: "an int",
    float: "a number",
    str: "a str",
    NoneType: "None",
    os.PathLike: "an os.PathLike",
    torch.dtype: "a torch.dtype",
}

HUB_FIELDS = ("revision", "code_revision", "tokenizer_revision", "download_dir")
"""vLLM's arguments for fetching a model from the Hugging Face Hub; only None is accepted."""


def checked_value(field: Field, value: object) -> object:
    """`value` if it has `field`'s annotated type, as an int or float in range (value_checks);
    bool is no int here (True is no block size), an int is a float, and where an os.PathLike
    (pathlib.Path) is allowed it becomes its str."""
    kinds = get_args(field.type) or (field.type,)
    if os.PathLike in kinds and isinstance(value, os.PathLike):
        value = os.fspath(value)
    allowed = " or ".join(_TYPE_NAMES.get(kind, f"a {kind.__name__}") for kind in kinds)
    if value is None and NoneType in kinds:
        return value
    if isinstance(value, bool):
        if bool in kinds:
            return value
    elif isinstance(value, int) and int in kinds:
        return as_int(field.name, value, allowed)
    elif isinstance(value, int | float) and float in kinds:
        return as_float(field.name, value, allowed)
    elif isinstance(value, tuple(k for k in kinds if k not in (bool, int, float, NoneType))):
        return value
    raise TypeError(f"{field.name} must be {allowed}, got {value!r} of type {type(value).__name__}")


def refuse_hub_value(name: str, value: object) -> None:
    """A hub revision or download folder, which pagedllm has no use for: it loads the local
    folder or .gguf file it is given, and nothing is downloaded."""
    if value is None:
        return
    if name == "download_dir":
        advice = "pass the local folder or .gguf file as model"
    else:
        target = "tokenizer" if name == "tokenizer_revision" else "model"
        advice = f"pass that revision's local folder as {target}"
    raise ValueError(
        f"{name}={value!r}: pagedllm loads local folders and .gguf files only, and nothing is "
        f"downloaded; leave {name} unset and {advice}"
    )
