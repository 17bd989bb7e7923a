"""pagedllm's Triton kernels: the paged KV-cache write (cache_write.py), unified paged
attention (unified_attention.py) and the fused MoE (fused_moe.py, moe_align_block_size.py,
activation.py; launch.py checks where a kernel can run).

The attention backend layers/attention_backends/triton_attn.py runs the attention kernels,
FusedMoE's float method the MoE ones; the torch reference (pagedllm/_torch_ops.py,
FusedMoE's per-expert loop) is their test oracle. Triton is optional (it ships with
torch's CUDA wheels and is a test extra), so this package imports without it and the two
kernel modules, which import triton, are imported on first use. Under Triton's interpreter
(TRITON_INTERPRET=1, which Triton reads when a kernel is decorated, so before those
modules' first import) the same kernels run on CPU tensors: that is how the tests, and an
engine without a GPU, run them. Triton's own library (tl.cdiv, tl.max, ...) is decorated
when triton is first imported, which torch._dynamo does too: the variable must be set
before that, in practice before the process starts.
"""

import importlib.util
import os
import sys

INTERPRET_ENV = "TRITON_INTERPRET"


def has_triton() -> bool:
    """Whether the triton package is installed (without importing it)."""
    return importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    """Whether Triton's interpreter is on: TRITON_INTERPRET is set, and was when triton's
    library was decorated if triton is already imported."""
    if os.environ.get(INTERPRET_ENV, "").strip().lower() not in ("1", "true", "on", "yes"):
        return False
    standard = sys.modules.get("triton.language.standard")
    return standard is None or type(standard.cdiv).__name__ == "InterpretedFunction"
