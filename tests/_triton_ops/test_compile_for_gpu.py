"""The Triton kernels compile for an H100/H200 (sm_90) on this machine, GPU or not
(compile_for_gpu.py): the lowering, register and shared-memory allocation and ptxas the
interpreter never runs. Reference: Triton's compiler accepting each kernel."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


def test_the_kernels_compile_for_sm_90() -> None:
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    env["TRITON_DEFAULT_FP_FUSION"] = "1"  # Triton 3.9's default, named to silence its warning
    script = Path(__file__).with_name("compile_for_gpu.py")
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    compiled = [line.split()[0] for line in done.stdout.splitlines()]
    assert compiled == ["_attention_kernel"] * 5 + [
        "_reduce_segments_kernel",
        "_reshape_and_cache_kernel",
        "_reshape_and_cache_kernel",
    ]
