"""fused_moe_tune's search space and its printed table row (the timing needs a GPU)."""

import math

import pytest

pytest.importorskip("triton")

from pagedllm._triton_ops import fused_moe_configs  # noqa: E402
from pagedllm.benchmarks.fused_moe_tune import (  # noqa: E402
    SEARCH_SPACE,
    candidate_configs,
    format_row,
)


def test_small_batches_keep_only_short_blocks() -> None:
    """One token to 8 of 128 experts has one row per active expert: 16-row blocks only."""
    assert {c["BLOCK_SIZE_M"] for c in candidate_configs(1, 128, 8)} == {16}
    assert {c["BLOCK_SIZE_M"] for c in candidate_configs(4096, 128, 8)} == {16, 32, 64, 128}
    assert len(candidate_configs(4096, 128, 8)) == math.prod(map(len, SEARCH_SPACE.values()))


def test_printed_row_is_the_tables_python() -> None:
    """Reference: the row evaluates, in fused_moe_configs' namespace, to the configs."""
    rows = {1: candidate_configs(1, 128, 8)[0], 4096: candidate_configs(4096, 128, 8)[-1]}
    text = format_row(128, 768, "NVIDIA_H200", rows)
    table = eval("{" + text + "}", vars(fused_moe_configs))
    assert table == {(128, 768, "NVIDIA_H200"): rows}
