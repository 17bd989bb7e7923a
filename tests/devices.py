"""The devices a test runs on: the CPU everywhere, CUDA where torch finds a GPU (skipped
elsewhere, as CI has none). The engine's code is the same on both; on CUDA every op takes
the torch path (pagedllm._C's kernels are CPU kernels)."""

import pytest
import torch

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

DEVICES = ["cpu", pytest.param("cuda", marks=needs_cuda)]
"""For `pytest.mark.parametrize("device", DEVICES)`."""
