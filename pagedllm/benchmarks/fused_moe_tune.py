"""Tune the fused MoE kernel's block sizes on this GPU, as vLLM's MoE kernel benchmark with --tune:
for each token count M, every candidate config is checked against the grouped torch path
once and timed over the whole fused_experts call (CUDA events, median of --iters after a
warm-up), and the fastest one becomes a row of pagedllm/_triton_ops/fused_moe_configs.py's
table, printed as Python to paste there.

    python -m pagedllm.benchmarks.fused_moe_tune --batch-sizes 1,16,64,256,1024,4096

The defaults are Qwen3-30B-A3B's shape at tp=1 (128 experts, top-8, hidden 2048, expert
intermediate 768), in bf16. Random weights, made on the GPU. Each distinct config is
compiled twice (gate/up and down), a few seconds each: the default batch sizes visit ~190
configs, so a first run spends most of its time compiling (Triton caches the builds for
the next); fewer --batch-sizes visit fewer.
"""

import argparse
import itertools
import statistics

import torch
import torch.nn.functional as F
from triton.runtime.errors import OutOfResources

from pagedllm._triton_ops.fused_moe import fused_experts
from pagedllm._triton_ops.fused_moe_configs import MoEConfig, device_name

SEARCH_SPACE = {
    "BLOCK_SIZE_M": (16, 32, 64, 128),
    "BLOCK_SIZE_N": (64, 128, 256),
    "BLOCK_SIZE_K": (64, 128),
    "GROUP_SIZE_M": (1, 16),
    "num_warps": (4, 8),
    "num_stages": (3, 4),
}


def candidate_configs(m: int, num_experts: int, top_k: int) -> list[MoEConfig]:
    """The search space, less M blocks much taller than an expert's expected rows (at least
    16): rows past an expert's tokens are padding the kernel multiplies for nothing."""
    rows_per_expert = max(1, m * top_k // num_experts)
    tallest = max(16, 2 * rows_per_expert)
    values = itertools.product(*SEARCH_SPACE.values())
    configs = [dict(zip(SEARCH_SPACE, v)) for v in values]
    return [c for c in configs if c["BLOCK_SIZE_M"] <= tallest]


def reference_experts(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> torch.Tensor:
    """Each expert's SwiGLU on its tokens in torch, weighted and summed over top-k."""
    out = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float32, device=x.device)
    inter = w2.shape[2]
    for expert in topk_ids.unique().tolist():
        token, slot = (topk_ids == expert).nonzero(as_tuple=True)
        gate_up = x[token] @ w13[expert].T
        y = (F.silu(gate_up[:, :inter]) * gate_up[:, inter:]) @ w2[expert].T
        out.index_add_(0, token, y.float() * topk_weights[token, slot, None].float())
    return out


def time_config(args: tuple[torch.Tensor, ...], config: MoEConfig, iters: int) -> float:
    """Median milliseconds of one fused_experts call."""
    for _ in range(3):
        fused_experts(*args, config=config)
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fused_experts(*args, config=config)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def tune_one(
    m: int, weights: tuple[torch.Tensor, torch.Tensor], num_experts: int, top_k: int, iters: int
) -> tuple[MoEConfig, float]:
    """(best config, its milliseconds) for M tokens."""
    w13, w2 = weights
    x = torch.randn(m, w13.shape[2], device=w13.device, dtype=w13.dtype)
    logits = torch.randn(m, num_experts, device=w13.device)
    topk_weights, topk_ids = torch.topk(logits.softmax(-1), top_k, dim=-1)
    args = (x, w13, w2, topk_weights.to(w13.dtype), topk_ids)
    expected = reference_experts(*args)
    best, best_ms = {}, float("inf")
    for config in candidate_configs(m, num_experts, top_k):
        try:
            actual = fused_experts(*args, config=config).float()
        except OutOfResources as error:  # more shared memory than this GPU has
            print(f"  M={m} {config}: {error}")
            continue
        error = (actual - expected).abs().max().item()
        if error > 0.05 * expected.abs().max().item():
            raise AssertionError(f"M={m} {config}: max error {error}")
        ms = time_config(args, config, iters)
        if ms < best_ms:
            best, best_ms = config, ms
    return best, best_ms


def format_row(num_experts: int, inter: int, name: str, rows: dict[int, MoEConfig]) -> str:
    lines = [f'    ({num_experts}, {inter}, "{name}"): {{']
    for m, c in rows.items():
        values = [c[k] for k in SEARCH_SPACE]
        lines.append(
            f"        {m}: _config({values[0]}, {values[1]}, {values[2]}, {values[3]}, "
            f"warps={values[4]}, stages={values[5]}),"
        )
    return "\n".join(lines + ["    },"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-experts", type=int, default=128)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--hidden-size", type=int, default=2048)
    parser.add_argument("--intermediate-size", type=int, default=768, help="per rank")
    parser.add_argument("--dtype", choices=("bfloat16", "float16"), default="bfloat16")
    parser.add_argument("--batch-sizes", default="1,16,64,256,1024,4096")
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("tuning needs a CUDA GPU")
    dtype, e, h, i = (
        getattr(torch, args.dtype),
        args.num_experts,
        args.hidden_size,
        args.intermediate_size,
    )
    w13 = torch.randn(e, 2 * i, h, device="cuda", dtype=dtype) / h**0.5
    w2 = torch.randn(e, h, i, device="cuda", dtype=dtype) / i**0.5
    rows = {}
    for m in (int(n) for n in args.batch_sizes.split(",")):
        rows[m], ms = tune_one(m, (w13, w2), e, args.top_k, args.iters)
        active = min(e, m * args.top_k)
        gbps = active * 3 * h * i * dtype.itemsize / ms / 1e6
        print(f"M={m}: {ms:.3f} ms, {gbps:.0f} GB/s of active expert weights, {rows[m]}")
    print(format_row(e, i, device_name(torch.device("cuda")), rows))


if __name__ == "__main__":
    main()
