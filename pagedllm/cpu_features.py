"""What the CPU computes natively, read at run time: which dtype `auto` picks depends on it."""

import torch


def native_bf16_matmul() -> str | None:
    """The CPU's native bfloat16 matmul units by name ("AMX" tiles, or "AVX-512 BF16" dot
    products), or None where bf16 would be emulated (AVX2, plain AVX-512): there bf16 matmuls
    run slower than float32 ones."""
    if _supported("_is_amx_tile_supported"):
        return "AMX"
    if _supported("_is_avx512_bf16_supported"):
        return "AVX-512 BF16"
    return None


def _supported(check: str) -> bool:
    """torch.cpu's own probe (cpuinfo); False where this torch lacks it."""
    probe = getattr(torch.cpu, check, None)
    return bool(probe()) if probe is not None else False
