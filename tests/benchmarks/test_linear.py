"""pagedllm/benchmarks/linear.py: its argument parsing, and one small run per dtype whose
report has a timing for each row count (reference: the requested rows)."""

import argparse

import pytest

from pagedllm import _cpu_kernels
from pagedllm.benchmarks.linear import format_linear, parse_rows, parse_shapes, run_linear


def test_rows_and_shapes_parse_or_name_the_bad_flag() -> None:
    assert parse_rows("1,16,256") == [1, 16, 256]
    assert parse_shapes("960x576,576x1536") == [(960, 576), (576, 1536)]
    for bad in ("0", "a", ""):
        with pytest.raises(ValueError, match="--rows"):
            parse_rows(bad)
    for bad in ("960", "960x0", "axb", "1x2x3"):
        with pytest.raises(ValueError, match="--shapes"):
            parse_shapes(bad)


@pytest.mark.skipif(not _cpu_kernels.available(), reason="needs pagedllm._C")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_run_times_the_kernel_and_f_linear_at_each_row_count(dtype: str) -> None:
    args = argparse.Namespace(
        rows="1,5", dtype=dtype, isa="portable", shapes="32x64,16x32", weight_mb=1, rounds=1
    )
    report = run_linear(args)
    assert (report["isa"], report["dtype"]) == ("portable", dtype)
    assert [t["rows"] for t in report["timings"]] == [1, 5]
    assert all(t["kernel_gflops"] > 0 and t["torch_gflops"] > 0 for t in report["timings"])
    assert "skinny_gemm portable vs F.linear" in format_linear(report)
