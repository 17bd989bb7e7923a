"""Builds pagedllm._C, the optional CPU kernels; project metadata lives in pyproject.toml.

optional=True: without a C compiler the install still succeeds and pagedllm falls back to
torch ops (see pagedllm/_custom_ops.py).
"""

import glob

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "pagedllm._C",
            sources=[
                "csrc/module.c",
                "csrc/skinny_gemm.c",
                "csrc/skinny_gemm_avx512_bf16.c",
                "csrc/skinny_gemm_avx512.c",
                "csrc/skinny_gemm_avx2.c",
                "csrc/skinny_gemm_portable.c",
                "csrc/amx_gemm.c",
                "csrc/prefill_attention_f32.c",
                "csrc/prefill_attention_f32_avx512.c",
                "csrc/prefill_attention_f32_avx2.c",
                "csrc/prefill_attention_f32_portable.c",
                "csrc/paged_attention.c",
                "csrc/paged_attention_avx512.c",
                "csrc/paged_attention_avx2.c",
                "csrc/paged_attention_portable.c",
                "csrc/convert.c",
                "csrc/argmax.c",
                "csrc/layernorm.c",
                "csrc/pos_encoding.c",
                "csrc/activation.c",
                "csrc/lora.c",
                "csrc/elementwise.c",
                "csrc/gguf_mm.c",
                "csrc/gguf_mm_avx512.c",
                "csrc/gguf_mm_avx2.c",
                "csrc/gguf_mm_portable.c",
                "csrc/gguf_pack.c",
                "csrc/gguf_dequant.c",
            ],
            # every header and fragment: editing any of them rebuilds the extension
            depends=sorted(glob.glob("csrc/*.h") + glob.glob("csrc/*.inc")),
            extra_compile_args=["-O3", "-fopenmp", "-ffp-contract=fast", "-Wno-psabi"],
            extra_link_args=["-fopenmp"],
            optional=True,
        )
    ]
)
