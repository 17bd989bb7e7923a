"""pagedllm._C's kernels as functions of tensors: the checked boundary to the C code.

The C functions take raw data pointers and sizes, so a wrong tensor there (another dtype, a
strided view, swapped arguments) reads or writes arbitrary memory. Every call into
pagedllm._C goes through this package, the only code to import it. Each kernel is declared
once (boundary.py: its binding's arguments in order, with names and kinds), and each function
checks every tensor's type, dtype, device, layout and shape against that declaration and
raises ValueError naming the argument; then it takes every size from the checked tensors
(callers pass none) and allocates the outputs, so pointers and sizes cannot disagree. Index
values (cache slots, block ids, positions) are checked by csrc/module.c, which reads them
anyway. When the extension loads, its bindings' signatures and flag values must equal the
declarations' (ImportError otherwise: an extension built from other sources).

The kernels by family: gemm.py (skinny_gemm, AMX), attention.py (the paged KV cache's
writes, decode and prefill attention), rowwise.py (norms, activations, RoPE, convert,
argmax), quantized.py (GGUF); flags.py holds the enums of their flag arguments.

Callers (`_custom_ops`) pick the kernel only when `available()`; _C is None without the
extension, and the functions read it here at every call (tests replace it).

Every kernel call is a launch: a binding and its arguments, all ints and floats. Within
`record_launches()` this thread's launches are also listed, and `replay_launches` runs such a
list again: the same kernels on the same memory, without the Python that produced them
(executor/cpu_graph.py captures decode steps that way).
"""

try:
    from pagedllm import _C
except ImportError:
    _C = None

from pagedllm._cpu_kernels.attention import (
    paged_attention_isas,
    paged_decode_attention,
    prefill_attention_f32,
    prefill_attention_f32_isas,
    reshape_and_cache,
)
from pagedllm._cpu_kernels.boundary import (
    KERNELS,
    Launch,
    record_launches,
    replay_launches,
)
from pagedllm._cpu_kernels.flags import GGUF_TYPES, FloatType, RotaryStyle, WeightLayout, c_names
from pagedllm._cpu_kernels.gemm import (
    SKINNY_PACKED,
    amx_available,
    amx_gemm_bf16,
    amx_pack_bf16,
    skinny_gemm,
    skinny_gemm_bf16,
    skinny_gemm_isas,
    skinny_gemm_reads_packed,
    skinny_pack,
    skinny_packable,
)
from pagedllm._cpu_kernels.quantized import (
    gguf_dequantize,
    gguf_isas,
    gguf_mm,
    gguf_pack,
    gguf_packed_shape,
    gguf_unpack_rows,
    gguf_weight_shape,
)
from pagedllm._cpu_kernels.rowwise import (
    add,
    argmax,
    convert,
    fused_add_layer_norm,
    fused_add_rms_norm,
    gelu,
    gelu_and_mul,
    layer_norm,
    lora_masked_add,
    rms_norm,
    rotary_embedding,
    scale,
    silu_and_mul,
)

__all__ = [
    "GGUF_TYPES",
    "SKINNY_PACKED",
    "FloatType",
    "Launch",
    "RotaryStyle",
    "WeightLayout",
    "add",
    "amx_available",
    "amx_gemm_bf16",
    "amx_pack_bf16",
    "argmax",
    "available",
    "convert",
    "fused_add_layer_norm",
    "fused_add_rms_norm",
    "gelu",
    "gelu_and_mul",
    "gguf_dequantize",
    "gguf_isas",
    "gguf_mm",
    "gguf_pack",
    "gguf_packed_shape",
    "gguf_unpack_rows",
    "gguf_weight_shape",
    "layer_norm",
    "lora_masked_add",
    "paged_attention_isas",
    "paged_decode_attention",
    "prefill_attention_f32",
    "prefill_attention_f32_isas",
    "record_launches",
    "replay_launches",
    "reshape_and_cache",
    "rms_norm",
    "rotary_embedding",
    "scale",
    "silu_and_mul",
    "skinny_gemm",
    "skinny_gemm_bf16",
    "skinny_gemm_isas",
    "skinny_gemm_reads_packed",
    "skinny_pack",
    "skinny_packable",
]


def available() -> bool:
    return _C is not None


def mismatches(signatures: dict[str, str], flags: dict[str, int]) -> list[str]:
    """How an extension's bindings' signatures and flag values (its signatures() and flags())
    differ from the declared ones: one line per binding or flag, empty when they agree."""
    declared = {name: kernel.signature for name, kernel in KERNELS.items()}
    lines = [
        f"binding {name}: C ({signatures.get(name)}), Python ({declared.get(name)})"
        for name in sorted(signatures.keys() | declared.keys())
        if signatures.get(name) != declared.get(name)
    ]
    names = c_names()
    return lines + [
        f"flag {name}: C {flags.get(name)}, Python {names.get(name)}"
        for name in sorted(flags.keys() | names.keys())
        if flags.get(name) != names.get(name)
    ]


if _C is not None and (_differences := mismatches(_C.signatures(), _C.flags())):
    raise ImportError(
        "pagedllm._C does not match the declarations of pagedllm/_cpu_kernels (an extension "
        "built from other sources? rebuild it: pip install -e .):\n" + "\n".join(_differences)
    )
