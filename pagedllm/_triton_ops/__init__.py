"""pagedllm's Triton kernels: GPU kernels that also run on CPU tensors under Triton's
interpreter (launch.py), which is how the tests check them against the torch reference.
The kernel modules need triton; callers import them where they have chosen a Triton
kernel, never at pagedllm's import (moe_align_block_size.py is torch only)."""
