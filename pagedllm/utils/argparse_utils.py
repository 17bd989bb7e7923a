"""vLLM's FlexibleArgumentParser: the command lines vLLM's launch scripts and docs write.

- `--max_model_len 4096` is `--max-model-len 4096` (a flag's underscores read as dashes);
- `--config FILE.yaml` reads flags from a YAML mapping of long flag names to values, placed
  before the command line's own so that the command line wins (vLLM's order: command line,
  then the file, then defaults); a `model` key stands for `serve`'s positional MODEL unless
  the command line names one.
- `human_readable_int` reads vLLM's integer suffixes for sizes: 1k = 1,000, 1K = 1,024,
  and m/M, g/G, t/T likewise.
"""

import argparse
import decimal
import json
import re
import sys
from collections.abc import Sequence

import yaml

_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def human_readable_int(text: str) -> int:
    """An integer, with vLLM's suffixes: decimal k/m/g/t (a float before them is allowed:
    25.6k = 25,600) and binary K/M/G/T (integers only: 32K = 32,768)."""
    match = re.fullmatch(r"\s*(-?\d+(?:\.\d+)?)\s*([kmgtKMGT]?)\s*", text)
    if match is None:
        raise argparse.ArgumentTypeError(f"invalid integer: {text!r}")
    number, suffix = match.groups()
    if not suffix:
        if "." in number:
            raise argparse.ArgumentTypeError(f"invalid integer: {text!r}")
        return int(number)
    if suffix in _BINARY:
        if "." in number:
            raise argparse.ArgumentTypeError(
                f"invalid integer: {text!r} (a binary suffix {suffix} takes a whole number)"
            )
        return int(number) * _BINARY[suffix]
    value = decimal.Decimal(number) * _DECIMAL[suffix]
    if value != int(value):
        raise argparse.ArgumentTypeError(f"invalid integer: {text!r}")
    return int(value)


class FlexibleArgumentParser(argparse.ArgumentParser):
    """argparse's parser reading flags as vLLM's does (see the module's docstring)."""

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        args = list(sys.argv[1:] if args is None else args)
        end = args.index("--") if "--" in args else len(args)  # after it: no flags
        args = [_dashed(a) for a in args[:end]] + args[end:]
        if "--config" in args[:end] or any(a.startswith("--config=") for a in args[:end]):
            try:
                args = _with_config(args, _option_strings(self))
            except ValueError as e:
                self.error(str(e))
        return super().parse_known_args(args, namespace)


def _dashed(arg: str) -> str:
    """`--max_model_len=5` -> `--max-model-len=5`; anything else unchanged."""
    if not arg.startswith("--"):
        return arg
    flag, eq, value = arg.partition("=")
    return flag.replace("_", "-") + eq + value


def _option_strings(parser: argparse.ArgumentParser) -> set[str]:
    """Every flag of `parser` and of its subcommands' parsers."""
    found: set[str] = set()
    for action in parser._actions:
        found.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= _option_strings(sub)
    return found


def _with_config(args: list[str], known: set[str]) -> list[str]:
    """`args` with `--config FILE` replaced by the file's flags, inserted after the
    subcommand and its positional MODEL (if the command line gives one there)."""
    i = next(k for k, a in enumerate(args) if a == "--config" or a.startswith("--config="))
    if args[i] == "--config":
        if i + 1 >= len(args):
            raise ValueError("--config needs a YAML file")
        path, rest = args[i + 1], args[:i] + args[i + 2 :]
    else:
        path, rest = args[i].partition("=")[2], args[:i] + args[i + 1 :]
    head = 1 if rest and not rest[0].startswith("-") else 0  # the subcommand
    has_model = len(rest) > head and not rest[head].startswith("-")
    if has_model:
        head += 1
    flags, model = _config_flags(path, known)
    if model is not None and not has_model:
        rest = rest[:head] + [model] + rest[head:]
        head += 1
    return rest[:head] + flags + rest[head:]


def _config_flags(path: str, known: set[str]) -> tuple[list[str], str | None]:
    """The flags a YAML config file sets, and its `model` (None if it names none). A false
    switch is its `--no-` flag, or nothing where the switch has none (it is off already)."""
    try:
        with open(path, encoding="utf-8") as f:
            config = yaml.safe_load(f)
    except OSError as e:
        raise ValueError(f"--config {path!r} cannot be read: {e}") from e
    except yaml.YAMLError as e:
        raise ValueError(f"--config {path!r} is not YAML: {e}") from e
    if config is None:
        return [], None
    if not isinstance(config, dict):
        raise ValueError(f"--config {path!r} must hold a mapping of flag names to values")
    model = config.pop("model", None)
    flags: list[str] = []
    for key, value in config.items():
        flag = _dashed("--" + str(key).removeprefix("--"))
        if value is None:
            continue
        if isinstance(value, bool):
            off = "--no-" + flag[2:]
            flags += [flag] if value else [off] if off in known else []
        elif isinstance(value, list):
            flags += [flag] + [_text(v) for v in value]
        else:
            flags.append(f"{flag}={_text(value)}")
    return flags, None if model is None else str(model)


def _text(value: object) -> str:
    return json.dumps(value) if isinstance(value, dict) else str(value)
