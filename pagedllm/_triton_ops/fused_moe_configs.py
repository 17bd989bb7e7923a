"""Block sizes of the fused MoE GEMM per shape, as vLLM's fused_moe configs: a table keyed
by (E, N, device name) of configs per batch size M, else a default from M and E.

N is the expert's intermediate size on this rank (w2_weight.shape[2]); the device name is
torch.cuda.get_device_name() with spaces as underscores ("NVIDIA_H200"). A table row maps
token counts M to a config; the row's nearest M is used, as vLLM does.
"""

import torch

MoEConfig = dict[str, int]
"""BLOCK_SIZE_M / N / K, GROUP_SIZE_M (blocks of M that share a column of weight tiles in
L2), num_warps, num_stages."""


def _config(m: int, n: int, k: int, group: int, warps: int = 4, stages: int = 3) -> MoEConfig:
    return {
        "BLOCK_SIZE_M": m,
        "BLOCK_SIZE_N": n,
        "BLOCK_SIZE_K": k,
        "GROUP_SIZE_M": group,
        "num_warps": warps,
        "num_stages": stages,
    }


# The seed MoE shape (Qwen3-30B-A3B: 128 experts, intermediate 768 at tp=1) on an H200 and
# an H100: the block sizes vLLM measured for its fused_moe_kernel, whose tiling this kernel
# shares (vLLM's configs E=128,N=768,device_name=NVIDIA_H200.json and
# ...=NVIDIA_H100_80GB_HBM3.json). Decode's few tokens per expert take 16-row blocks and long
# K tiles that stream the weights; prefill's hundreds take 128 x 256 tiles. Not yet
# re-measured with this kernel: on the GPU, run and paste the row it prints:
#     python -m pagedllm.benchmarks.fused_moe_tune
_TUNED: dict[tuple[int, int, str], dict[int, MoEConfig]] = {
    (128, 768, "NVIDIA_H200"): {
        1: _config(16, 64, 64, 1, stages=5),
        2: _config(16, 64, 64, 1, stages=4),
        4: _config(16, 64, 128, 16, stages=2),
        8: _config(16, 64, 128, 1, stages=3),
        16: _config(16, 64, 256, 1, stages=2),
        24: _config(16, 64, 128, 1, stages=4),
        32: _config(16, 64, 128, 16, stages=2),
        48: _config(16, 128, 128, 16, stages=3),
        64: _config(16, 256, 128, 1, warps=8, stages=2),
        96: _config(16, 128, 128, 1, stages=2),
        128: _config(16, 128, 128, 1, stages=2),
        256: _config(32, 256, 128, 16, stages=2),
        512: _config(64, 128, 64, 1, stages=3),
        1024: _config(128, 256, 64, 16, warps=8, stages=4),
        1536: _config(128, 256, 64, 1, warps=8, stages=4),
        2048: _config(128, 256, 64, 1, warps=8, stages=4),
        3072: _config(128, 256, 64, 1, warps=8, stages=4),
        4096: _config(128, 256, 64, 16, warps=8, stages=4),
    },
    (128, 768, "NVIDIA_H100_80GB_HBM3"): {
        1: _config(16, 32, 64, 1, stages=4),
        2: _config(16, 64, 64, 32, stages=3),
        4: _config(16, 128, 64, 1, stages=4),
        8: _config(16, 64, 64, 64, stages=5),
        16: _config(16, 32, 256, 64, stages=2),
        24: _config(16, 64, 128, 16, stages=3),
        32: _config(16, 32, 128, 1, stages=5),
        48: _config(16, 64, 128, 1, stages=3),
        64: _config(16, 256, 128, 1, warps=8, stages=3),
        96: _config(16, 128, 128, 1, stages=2),
        128: _config(16, 256, 128, 1, warps=8, stages=2),
        256: _config(32, 256, 128, 1, warps=8, stages=3),
        512: _config(64, 128, 64, 1, stages=3),
        1024: _config(64, 256, 64, 1, warps=8, stages=5),
        1536: _config(128, 256, 64, 1, warps=8, stages=4),
        2048: _config(128, 256, 64, 1, warps=8, stages=4),
        3072: _config(128, 256, 64, 1, warps=8, stages=4),
        4096: _config(128, 256, 64, 1, warps=8, stages=4),
    },
}


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device).replace(" ", "_")


def get_default_config(m: int, num_experts: int, dtype: torch.dtype) -> MoEConfig:
    """vLLM's rule: small blocks when the batch is no larger than the expert count (about
    one token per active expert), 64x64 tiles otherwise; float32 takes half-depth K tiles
    (its tiles are twice the bytes in shared memory)."""
    small = m <= num_experts
    config = _config(16, 32, 64, 1) if small else _config(64, 64, 32, 8)
    if dtype == torch.float32:
        config["BLOCK_SIZE_K"] //= 2
    return config


def get_config(
    m: int, num_experts: int, n: int, dtype: torch.dtype, device: torch.device
) -> MoEConfig:
    """The table's config for M tokens where the shape and device have a row (bf16 and fp16
    only: the table's tiles are sized for 2-byte elements), else the default."""
    if device.type == "cuda" and dtype != torch.float32:
        row = _TUNED.get((num_experts, n, device_name(device)))
        if row:
            return row[min(row, key=lambda key: abs(key - m))]
    return get_default_config(m, num_experts, dtype)
