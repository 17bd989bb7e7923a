"""The Triton kernel tests, run on CPU tensors under Triton's interpreter in a child pytest
with TRITON_INTERPRET=1: the variable must be set before triton decorates the kernels,
which this process may already have done, and it would turn every later kernel in this
process into an interpreted one."""

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).parents[2]
INTERPRETED_TESTS = [
    "tests/triton_ops/test_moe_align_block_size.py",
    "tests/triton_ops/test_fused_moe.py",
    "tests/triton_ops/test_activation.py",
]


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="the child pytest")
def test_triton_kernels_under_interpreter() -> None:
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider"]
    result = subprocess.run(
        command + INTERPRETED_TESTS, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-4000:]
    assert " passed" in result.stdout and "skipped" not in result.stdout, result.stdout[-2000:]
