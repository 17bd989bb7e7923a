"""`pagedllm bench report`: BENCHMARKS.md's tables, re-run on the machine at hand.

Each table is one `pagedllm bench` command, run in this process as written; the report is
markdown: the machine (CPU model, instruction sets, threads, memory), torch's version, the
date, pagedllm's commit where it runs from a git checkout, then per table its title, the
exact command and what it printed. Peers that are not installed print their own
`skipped: ...` line; vLLM runs only with --vllm-python.
"""

import argparse
import contextlib
import datetime
import io
import os
import platform
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

import torch

from pagedllm.benchmarks.hf_folder import hf_folder_path
from pagedllm.config import default_model_path
from pagedllm.cpu_features import native_bf16_matmul


@dataclass(frozen=True)
class Table:
    title: str
    command: str
    """`pagedllm bench` arguments; {hf} is the default model's float32 HF folder, {vllm}
    becomes ",vllm" with --vllm-python and nothing without."""


TABLES: tuple[Table, ...] = (
    Table(
        "Batch 1: the default model (Q4_1 GGUF), 128 prompt and 128 output tokens",
        "latency --batch-size 1 --input-len 128 --output-len 128 --num-iters 3 "
        "--backend pagedllm,llama.cpp,hf",
    ),
    Table(
        "Time to first token: one 512-token prompt, the default model",
        "latency --batch-size 1 --input-len 512 --output-len 2 --num-iters 10 "
        "--backend pagedllm,llama.cpp",
    ),
    Table(
        "Batch 16: the default model, 32 prompt and 128 output tokens",
        "latency --batch-size 16 --input-len 32 --output-len 128 --num-iters 3 "
        "--backend pagedllm,hf",
    ),
    Table(
        "Throughput: 64 prompts (32-512 tokens, outputs 32-256), the default model",
        "throughput --num-prompts 64 --backend pagedllm,hf",
    ),
    Table(
        "Throughput: 64 prompts, the same weights as an HF folder in bf16",
        "throughput --num-prompts 64 --backend pagedllm{vllm} --model {hf} --dtype bfloat16",
    ),
    Table(
        "Throughput: 64 prompts, the same weights as an HF folder in float32",
        "throughput --num-prompts 64 --backend pagedllm{vllm} --model {hf} --dtype float32",
    ),
    Table(
        "Speculative decoding: n-gram drafts against none, the default model",
        "spec-decode",
    ),
    Table("LoRA adapters: base rows, one adapter and two against no LoRA", "lora"),
    Table("Perplexity: the default model on the fixed text", "perplexity"),
)


def machine() -> str:
    """One line: CPU model, its instruction sets, threads, memory, torch, date, commit."""
    flags = _cpuinfo("flags").split()
    isas = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile") if f in flags]
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (
        f"{_cpuinfo('model name') or platform.processor()} ({', '.join(isas) or 'no AVX2'}; "
        f"native bf16 matmul: {native_bf16_matmul() or 'none'}), {torch.get_num_threads()} "
        f"threads, {memory:.0f} GiB; torch {torch.__version__}; "
        f"{datetime.date.today().isoformat()}; pagedllm commit {_commit() or 'unknown'}"
    )


def _cpuinfo(key: str) -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.split(":")[0].strip() == key:
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def _commit() -> str | None:
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        out = subprocess.run(
            ["git", "-C", here, "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def command_of(table: Table, vllm_python: str | None) -> list[str]:
    """The table's `pagedllm bench` arguments for this run."""
    text = table.command.replace("{vllm}", ",vllm" if vllm_python else "")
    if "{hf}" in text:
        text = text.replace("{hf}", hf_folder_path(default_model_path()))
    argv = text.split()
    if vllm_python and "vllm" in text:
        argv += ["--vllm-python", vllm_python]
    return argv


def run_report(args: argparse.Namespace, run_bench: Callable[[list[str]], None]) -> str:
    """The markdown report of the tables whose title contains --only (all by default);
    run_bench(argv) runs one `pagedllm bench` command, printing its result."""
    parts = ["# pagedllm benchmark report", "", f"Machine: {machine()}.", ""]
    for table in TABLES:
        if args.only and args.only.lower() not in table.title.lower():
            continue
        argv = command_of(table, args.vllm_python)
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            run_bench(argv)
        parts += [f"## {table.title}", "", "```", f"$ pagedllm bench {' '.join(argv)}"]
        parts += [printed.getvalue().rstrip(), "```", ""]
    return "\n".join(parts)
