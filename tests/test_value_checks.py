"""pagedllm/value_checks.py against its definitions: the signed 64-bit range, float32's
largest finite value (3.4028234663852886e38), valid Unicode (no lone surrogate), logit
bias clamped to [-100, 100], token ids in [0, vocab)."""

import pytest

from pagedllm.value_checks import (
    as_float,
    as_int,
    as_int_list,
    as_logit_bias,
    as_str_list,
    check_ids_in_vocab,
    check_text,
)


def test_ints_within_int64() -> None:
    assert as_int("x", 2**63 - 1, "an int") == 2**63 - 1
    assert as_int("x", -(2**63), "an int") == -(2**63)
    with pytest.raises(ValueError, match="x must be an int in the signed 64-bit range"):
        as_int("x", 2**63, "an int")
    with pytest.raises(TypeError, match="x must be an int, got True of type bool"):
        as_int("x", True, "an int")


def test_floats_finite_within_float32() -> None:
    assert as_float("t", 3.4028234663852886e38, "a number") == 3.4028234663852886e38
    with pytest.raises(ValueError, match="within float32's range"):
        as_float("t", 3.5e38, "a number")
    for bad in (float("nan"), float("inf"), -float("inf")):
        with pytest.raises(ValueError, match="t must be a number, got"):
            as_float("t", bad, "a number")
    with pytest.raises(TypeError):
        as_float("t", "1.0", "a number")


def test_text_must_be_valid_unicode() -> None:
    assert check_text("stop", "ünïcödé ✓") == "ünïcödé ✓"
    with pytest.raises(ValueError, match=r"stop is not valid Unicode: .* at index 2"):
        check_text("stop", "ab\udc80c")
    with pytest.raises(ValueError, match="lone surrogate"):
        as_str_list("bad_words", ["ok", "\ud800"], strip=True)


def test_containers_and_vocab() -> None:
    assert as_int_list("ids", (3, 4)) == [3, 4]
    assert as_logit_bias({"5": 1e3, 7: -250.5, "-1": 0.5}) == {5: 100.0, 7: -100.0, -1: 0.5}
    check_ids_in_vocab("ids", [0, 9], 10)
    with pytest.raises(ValueError, match=r"ids must be token ids in \[0, 10\), got \[10, -1\]"):
        check_ids_in_vocab("ids", [10, -1, 3], 10)
