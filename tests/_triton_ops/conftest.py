"""Where the Triton kernel tests run: on CPU tensors under Triton's interpreter in the child
pytest that test_other_triton_mode.py starts with TRITON_INTERPRET=1, and on CUDA tensors,
compiled, where a GPU is present; skipped otherwise."""

import os

import pytest
import torch


@pytest.fixture
def triton_device() -> torch.device:
    if os.environ.get("TRITON_INTERPRET") == "1":
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda")
    pytest.skip("runs under TRITON_INTERPRET=1 (test_other_triton_mode.py) or on CUDA")
