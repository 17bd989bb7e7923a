"""Checks of user-given values, each raising ValueError/TypeError that names the field, the
value and what is allowed: the ranges the sampler's tensors can hold (int64, float32), valid
Unicode, token ids in the vocabulary. SamplingParams builds its checks from these."""

import json
import math
import os

_MAX_LOGIT_BIAS = 100.0
_FLOAT32_MAX = 3.4028234663852886e38  # larger values overflow to inf in the sampler
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def fail(name: str, value: object, allowed: str) -> None:
    raise ValueError(f"{name} must be {allowed}, got {value!r}")


def as_int(name: str, value: object, allowed: str) -> int:
    """An int within the signed 64-bit range (the sampler's tensors are int64)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be {allowed}, got {value!r} of type {type(value).__name__}")
    if not _INT64_MIN <= value <= _INT64_MAX:
        fail(name, value, f"{allowed} in the signed 64-bit range [-2**63, 2**63 - 1]")
    return value


def as_float(name: str, value: object, allowed: str) -> float:
    """A number that stays finite as float32, the sampler's dtype: 1e39 would become inf."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be {allowed}, got {value!r} of type {type(value).__name__}")
    if not math.isfinite(value):
        fail(name, value, allowed)
    if abs(value) > _FLOAT32_MAX:
        fail(name, value, f"{allowed} within float32's range (|x| <= 3.4e38)")
    return float(value)


def check_text(name: str, text: str) -> str:
    """`text` if it is valid Unicode; a lone surrogate (JSON's "\\ud800") cannot be
    tokenized or sent back as UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(
            f"{name} is not valid Unicode: lone surrogate {text[e.start]!r} at index {e.start}"
        ) from None
    return text


def as_int_list(name: str, value: object) -> list[int]:
    if isinstance(value, str) or not isinstance(value, list | tuple | set):
        raise TypeError(f"{name} must be a list of ints, got {type(value).__name__}")
    return [as_int(f"{name}[{i}]", v, "an int") for i, v in enumerate(value)]


def as_str_list(name: str, value: object, strip: bool) -> list[str]:
    """A str or a list of non-empty strings (non-blank if `strip`), as a list."""
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list | tuple):
        raise TypeError(f"{name} must be a str or a list of str, got {type(value).__name__}")
    for v in values:
        if not isinstance(v, str):
            raise TypeError(f"{name} must contain only str, got {v!r}")
        check_text(name, v)
        if not (v.strip() if strip else v):
            raise ValueError(f"{name} cannot contain an empty string, got {values!r}")
    return list(values)


def as_logit_bias(value: object) -> dict[int, float]:
    """Token id -> bias clamped to [-100, 100]; keys may be ints or decimal strings (JSON)."""
    if not isinstance(value, dict):
        raise TypeError(f"logit_bias must be a dict of token id -> float, got {type(value)}")
    bias = {}
    for key, val in value.items():
        if isinstance(key, str) and key.lstrip("-").isdigit():
            key = int(key)
        token = as_int("logit_bias key", key, "a token id (int)")
        val = as_float(f"logit_bias[{token}]", val, "a finite number")
        bias[token] = min(_MAX_LOGIT_BIAS, max(-_MAX_LOGIT_BIAS, val))
    return bias


def check_ids_in_vocab(name: str, ids: list[int], vocab_size: int) -> None:
    bad = [i for i in ids if not 0 <= i < vocab_size]
    if bad:
        raise ValueError(f"{name} must be token ids in [0, {vocab_size}), got {bad}")


def as_json_object(name: str, value: object) -> dict:
    """A dict, or the JSON object a str holds (a CLI flag's value), with str keys."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"{name} {value!r} is not a JSON object: {e}") from e
    if not isinstance(value, dict) or not all(isinstance(key, str) for key in value):
        raise ValueError(f"{name} must be a JSON object (a dict with str keys), got {value!r}")
    return value


def as_truncate_prompt_tokens(value: object) -> int | None:
    """vLLM's truncate_prompt_tokens: None, -1 (max_model_len) or a count >= 1."""
    if value is None:
        return None
    keep = as_int("truncate_prompt_tokens", value, "an int")
    if keep == 0 or keep < -1:
        raise ValueError(
            f"truncate_prompt_tokens {keep} must be >= 1, or -1 for max_model_len (or None)"
        )
    return keep


def env_number(name: str, unit: str, positive: bool) -> float | None:
    """The number environment variable `name` holds: None when it is unset or empty, else a
    finite number >= 0 (> 0 where `positive`), or a ValueError naming the variable."""
    text = os.environ.get(name, "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value > 0 if positive else value >= 0) or value == math.inf:
        raise ValueError(
            f"{name}={text!r} must be a number of {unit} {'>' if positive else '>='} 0"
        )
    return value


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def env_flag(name: str) -> bool | None:
    """The switch environment variable `name` holds: None when it is unset or empty, else
    True or False (1/true/yes/on, 0/false/no/off, any case), or a ValueError naming it."""
    text = os.environ.get(name, "").strip()
    if not text:
        return None
    if text.lower() in _TRUE + _FALSE:
        return text.lower() in _TRUE
    raise ValueError(f"{name}={text!r}: use 1 or 0")
