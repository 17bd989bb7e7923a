"""The flags the kernels take, as enums: mirrors of csrc/ops.h's (and, for GGUF block types,
csrc/gguf.h's), checked equal to pagedllm._C's flags() when the extension loads."""

from enum import IntEnum

import torch

from pagedllm.gguf.block_types import NATIVE_TYPES


class FloatType(IntEnum):
    """A tensor's element type (ops.h's enum float_type, FLOAT_*)."""

    FLOAT32 = 0
    BFLOAT16 = 1


class WeightLayout(IntEnum):
    """skinny_gemm's weight: plain [N, K] or in skinny_pack's order (enum weight_layout)."""

    PLAIN = 0
    PACKED = 1


class RotaryStyle(IntEnum):
    """rotary_embedding's pairs: GPT-J's interleaved or GPT-NeoX's halves (enum rotary_style)."""

    GPTJ = 0
    NEOX = 1


class GeluApproximate(IntEnum):
    """gelu's and gelu_and_mul's form: the erf definition or the tanh approximation (enum
    gelu_approximate), torch's F.gelu `approximate` "none" and "tanh"."""

    NONE = 0
    TANH = 1


ISA_BEST = -1
"""An isa argument: the best build this CPU runs (ops.h's ISA_BEST); else an index into the
kernel's table of builds."""

FLOAT_TYPE = {torch.float32: FloatType.FLOAT32, torch.bfloat16: FloatType.BFLOAT16}
"""The flag of each dtype the kernels take."""

GELU_APPROXIMATE = {"none": GeluApproximate.NONE, "tanh": GeluApproximate.TANH}
"""The flag of each F.gelu `approximate` gelu_and_mul takes."""

GGUF_TYPES = NATIVE_TYPES
"""The GGUF block types gguf_pack, gguf_mm and gguf_dequantize take (gguf.h's GGUF_*)."""

_PREFIXES = {
    FloatType: "FLOAT",
    WeightLayout: "WEIGHT",
    RotaryStyle: "ROTARY",
    GeluApproximate: "GELU",
}


def c_names() -> dict[str, int]:
    """Every flag under the name C gives it: what pagedllm._C's flags() must return."""
    names = {"ISA_BEST": ISA_BEST} | {f"GGUF_{t.name}": int(t) for t in GGUF_TYPES}
    for enum, prefix in _PREFIXES.items():
        names |= {f"{prefix}_{flag.name}": int(flag) for flag in enum}
    return names
