"""`pagedllm bench linear`: GFLOP/s of the unquantized linear kernel against F.linear.

The kernel is a build of skinny_gemm (the best, or --isa) on weights packed as
prepack_linear_weight packs them for that build; F.linear runs on the plain weights (MKL for
float32, oneDNN for bfloat16). Both multiply the same matrices, a decoder layer's of the
default model (or --shapes), in alternating rounds in one process, best round of each: the
host's load moves both alike. The matrices are copied until they fill --weight-mb, more
than a last-level cache, and few rows go over every copy, so that their weights stream from
memory as in a decode step; more rows go over fewer copies, enough for a second of work.
"""

import argparse
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from pagedllm import _cpu_kernels

DEFAULT_SHAPES = "960x576,576x576,3072x576,576x1536"
"""The default model's decoder matrices, [N, K] each: qkv, o, gate_up, down."""

_ROUND_FLOP = 2e9  # floating-point operations a round does at least, memory permitting


@dataclass(frozen=True)
class LinearTiming:
    rows: int
    kernel_gflops: float
    torch_gflops: float


def parse_rows(text: str) -> list[int]:
    """'1,16,256' -> [1, 16, 256]: row counts of x."""
    try:
        rows = [int(n) for n in text.split(",")]
    except ValueError:
        rows = []
    if not rows or min(rows) < 1:
        raise ValueError(f"--rows {text!r}: use positive counts, e.g. 1,16,256")
    return rows


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """'960x576,576x1536' -> [(960, 576), (576, 1536)]: weights [N, K]."""
    try:
        shapes = [tuple(int(n) for n in shape.split("x")) for shape in text.split(",")]
    except ValueError:
        shapes = []
    if not shapes or any(len(s) != 2 or min(s) < 1 for s in shapes):
        raise ValueError(f"--shapes {text!r}: use NxK[,NxK...], e.g. {DEFAULT_SHAPES}")
    return shapes


def run_linear(args: argparse.Namespace) -> dict:
    """{"isa", "dtype", "threads", "timings": [LinearTiming as a dict per row count]}."""
    if not _cpu_kernels.available():
        raise ValueError("bench linear times pagedllm._C's kernel, which is not built")
    dtype = torch.bfloat16 if args.dtype == "bfloat16" else torch.float32
    isa = args.isa or _cpu_kernels.skinny_gemm_isas()[0]
    rows_list, shapes = parse_rows(args.rows), parse_shapes(args.shapes)
    layer_bytes = sum(n * k for n, k in shapes) * dtype.itemsize
    copies = max(1, math.ceil(args.weight_mb * 1024**2 / layer_bytes))
    plain = [[torch.randn(n, k).to(dtype) for n, k in shapes] for _ in range(copies)]
    packed = [[_packed_for(w, isa) for w in layer] for layer in plain]
    gemm = _cpu_kernels.skinny_gemm_bf16 if dtype is torch.bfloat16 else _cpu_kernels.skinny_gemm
    timings = []
    for rows in rows_list:
        x = [torch.randn(rows, k).to(dtype) for _, k in shapes]
        layer_flop = 2 * rows * sum(n * k for n, k in shapes)
        used = min(copies, math.ceil(_ROUND_FLOP / layer_flop))
        kernel = _timer(lambda w, xi: gemm(xi, w, None, isa=isa), packed[:used], x)
        torch_ = _timer(lambda w, xi: F.linear(xi, w), plain[:used], x)
        best_kernel, best_torch = math.inf, math.inf
        for _ in range(args.rounds):
            best_kernel, best_torch = min(best_kernel, kernel()), min(best_torch, torch_())
        flop = used * layer_flop / 1e9
        timings.append(asdict(LinearTiming(rows, flop / best_kernel, flop / best_torch)))
    return {"isa": isa, "dtype": args.dtype, "threads": torch.get_num_threads(), "timings": timings}


def _packed_for(weight: torch.Tensor, isa: str) -> torch.Tensor:
    """weight in the order that build reads, where it reads one and weight is whole blocks."""
    reads = _cpu_kernels.skinny_gemm_reads_packed(weight.dtype, isa)
    return (
        _cpu_kernels.skinny_pack(weight)
        if reads and _cpu_kernels.skinny_packable(weight)
        else weight
    )


def _timer(
    matmul: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    layers: list[list[torch.Tensor]],
    x: list[torch.Tensor],
) -> Callable[[], float]:
    """A function that runs matmul over every layer's weights once and returns the seconds."""

    def timed() -> float:
        start = time.perf_counter()
        for layer in layers:
            for w, xi in zip(layer, x, strict=True):
                matmul(w, xi)
        return time.perf_counter() - start

    return timed


def format_linear(report: dict) -> str:
    head = (
        f"skinny_gemm {report['isa']} vs F.linear, {report['dtype']}, {report['threads']} threads"
    )
    lines = [head, f"{'rows':>6} {'kernel GFLOP/s':>15} {'F.linear GFLOP/s':>17} {'ratio':>6}"]
    for t in report["timings"]:
        ratio = t["kernel_gflops"] / t["torch_gflops"]
        lines.append(
            f"{t['rows']:>6} {t['kernel_gflops']:>15.1f} {t['torch_gflops']:>17.1f} {ratio:>6.2f}"
        )
    return "\n".join(lines)
