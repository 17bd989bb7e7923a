"""The Triton tests of the mode this process is not in, run in a child pytest. triton.jit
picks compiled or interpreted kernels from TRITON_INTERPRET when it decorates them (and
triton's own library when triton is first imported), so a process holds one mode:

- compiled, without a GPU: the kernel tests run on CPU tensors under the interpreter in a
  child with TRITON_INTERPRET=1 (with a GPU they run here, compiled, on CUDA);
- interpreted: the checks that need compiled kernels (the sm_90 builds, the refusal of CPU
  tensors) run in a child with TRITON_INTERPRET=0.
"""

import os
import pathlib
import subprocess
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).parents[2]
INTERPRETED_TESTS = [
    "tests/_triton_ops/test_moe_align_block_size.py",
    "tests/_triton_ops/test_fused_moe.py",
    "tests/_triton_ops/test_activation.py",
    "tests/_triton_ops/test_layernorm.py",
    "tests/_triton_ops/test_rotary.py",
    "tests/_triton_ops/test_topk_softmax.py",
    "tests/_triton_ops/test_rowwise_in_the_engine.py",
]
COMPILED_TESTS = ["tests/_triton_ops/test_compile_sm90.py", "tests/_triton_ops/test_launch.py"]


def test_the_other_mode_in_a_child_pytest() -> None:
    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") == "1":
        tests, mode = COMPILED_TESTS, "0"
    elif torch.cuda.is_available():
        pytest.skip("the kernel tests run in this process, on CUDA")
    else:
        tests, mode = INTERPRETED_TESTS, "1"
    env = {**os.environ, "TRITON_INTERPRET": mode}
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-4000:]
    assert " passed" in result.stdout and "skipped" not in result.stdout, result.stdout[-2000:]
