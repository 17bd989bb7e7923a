"""Compiles pagedllm's Triton kernels to an sm_90 (H100/H200) cubin on a machine without a
GPU: Triton's wheel carries the NVIDIA backend and ptxas, so every lowering step a GPU launch
would take runs here. Run as a script (test_compile_for_gpu.py does, in a process without
TRITON_INTERPRET, under which the kernels would be the interpreter's); prints one line per
kernel compiled, and raises on the first that does not."""

import os
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from pagedllm._triton_ops import cache_write, unified_attention

TARGET = GPUTarget("cuda", 90, 32)
TYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "fp8": "fp8e4nv"}


def compile_kernel(
    kernel: triton.JITFunction, dtype: str, constexprs: dict, cache_dtype: str | None = None
) -> None:
    """kernel with every `*_ptr` argument a pointer (to float32 for the split's partials, to
    int32 for the batch's tables, to `cache_dtype` (default `dtype`) for the caches, else to
    `dtype`), `scale` and `softcap` floats and the rest int32."""
    signature = {}
    for name in kernel.arg_names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif name.startswith("segm_"):
            signature[name] = "*fp32"
        elif name in ("block_tables_ptr", "seq_lens_ptr", "query_start_loc_ptr"):
            signature[name] = "*i32"
        elif name == "slot_mapping_ptr":
            signature[name] = "*i64"
        elif name in ("k_cache_ptr", "v_cache_ptr"):
            signature[name] = "*" + TYPES[cache_dtype or dtype]
        elif name.endswith("_ptr"):
            signature[name] = "*" + TYPES[dtype]
        else:
            signature[name] = "fp32" if name in ("scale", "softcap") else "i32"
    compiled = triton.compile(ASTSource(kernel, signature, constexprs), target=TARGET)
    print(kernel.__name__, dtype, cache_dtype, constexprs, "shared", compiled.metadata.shared)


def attention_constexprs(
    group: int, head_size: int, splits: int, window: int, softcap: bool, dtype: str
) -> dict:
    block_m = max(unified_attention.MIN_BLOCK_M, triton.next_power_of_2(group))
    return dict(
        NUM_HEADS=4 * group,
        GROUP=group,
        HEAD_SIZE=head_size,
        HEAD_PADDED=max(16, triton.next_power_of_2(head_size)),
        BLOCK_SIZE=16,
        TILE=unified_attention.TILE_SIZE,
        BLOCK_Q=block_m // group,
        BLOCK_M=block_m,
        SLIDING_WINDOW=window,
        USE_SOFTCAP=softcap,
        NUM_SEGMENTS=splits,
        DOT=unified_attention.DOT_FP32 if dtype == "float32" else unified_attention.DOT_NATIVE,
    )


def main() -> None:
    assert not os.environ.get("TRITON_INTERPRET"), "compile outside the interpreter"
    for dtype, cache_dtype, group, head_size, splits, window, softcap in [
        ("bfloat16", None, 4, 128, 16, 0, False),
        ("float16", None, 8, 64, 1, 0, False),
        ("float32", None, 1, 80, 1, 128, False),
        ("bfloat16", "fp8", 4, 128, 1, 0, False),
        ("bfloat16", None, 2, 256, 16, 4096, True),  # Gemma 2's local layers
    ]:
        constexprs = attention_constexprs(group, head_size, splits, window, softcap, dtype)
        compile_kernel(unified_attention._attention_kernel, dtype, constexprs, cache_dtype)
    reduce = dict(NUM_HEADS=32, HEAD_SIZE=128, HEAD_PADDED=128, NUM_SEGMENTS=16)
    compile_kernel(unified_attention._reduce_segments_kernel, "bfloat16", reduce)
    write = dict(BLOCK_SIZE=16, ROW=8 * 128, ROW_PADDED=1024)
    compile_kernel(cache_write._reshape_and_cache_kernel, "bfloat16", write)
    compile_kernel(cache_write._reshape_and_cache_kernel, "bfloat16", write, "fp8")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
