"""`pagedllm bench throughput | latency | spec-decode | lora | perplexity | serve | linear |
report`."""

import argparse
import functools
import json

from pagedllm.benchmarks.gguf_copy import GGUF_TYPES, gguf_copy_path
from pagedllm.benchmarks.latency import LATENCY_BACKENDS, format_latency, run_latency
from pagedllm.benchmarks.linear import DEFAULT_SHAPES, format_linear, run_linear
from pagedllm.benchmarks.lora import format_lora, run_lora
from pagedllm.benchmarks.perplexity import format_perplexity, run_perplexity
from pagedllm.benchmarks.report import run_report
from pagedllm.benchmarks.serve import format_serve, run_serve
from pagedllm.benchmarks.spec_decode import format_spec_decode, run_spec_decode
from pagedllm.benchmarks.throughput import (
    THROUGHPUT_BACKENDS,
    format_throughput,
    run_throughput,
)
from pagedllm.benchmarks.vllm_backend import (
    DEFAULT_KV_CACHE_GIB,
    KV_CACHE_ENV,
    check_vllm_python,
    vllm_peer,
)
from pagedllm.config import MAX_LORA_RANKS, default_model_path
from pagedllm.engine.arg_utils import EngineArgs


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="benchmark throughput, latency, perplexity, a running server, or the linear kernel",
        description="Benchmarks on random token prompts (seeded), pagedllm against peers.",
    )
    benchmarks = parser.add_subparsers(dest="bench_command", required=True, metavar="BENCHMARK")
    _add_throughput(benchmarks)
    _add_latency(benchmarks)
    _add_spec_decode(benchmarks)
    _add_lora(benchmarks)
    _add_perplexity(benchmarks)
    _add_serve(benchmarks)
    _add_linear(benchmarks)
    _add_report(benchmarks)


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=int, default=0, help="seed of the random prompts")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON here")


def _add_model_args(parser: argparse.ArgumentParser) -> None:
    """The engine flags (--model, --dtype, --quantization, ...) and --gguf-type."""
    parser.add_argument(
        "--gguf-type",
        choices=GGUF_TYPES,
        default=None,
        help="run every backend on a copy of the GGUF model with its weights in this type, "
        "written once into ~/.cache/pagedllm (1-D tensors stay f32)",
    )
    EngineArgs.add_cli_args(parser)


def _add_backend(parser: argparse.ArgumentParser, choices: tuple[str, ...], default: str) -> None:
    parser.add_argument(
        "--backend",
        default=default,
        help=f"one of {', '.join(choices)}, a comma-separated list, or all (default {default})",
    )
    parser.add_argument(
        "--vllm-python",
        metavar="PATH",
        default=None,
        help="the python of a virtualenv with vLLM's CPU build, for --backend vllm "
        "(see BENCHMARKS.md; without it 'all' skips vllm)",
    )
    parser.add_argument(
        "--vllm-kv-cache-gib",
        type=int,
        default=None,
        help=f"vLLM's KV cache in GiB, passed as {KV_CACHE_ENV} "
        f"(default: ${KV_CACHE_ENV}, else {DEFAULT_KV_CACHE_GIB})",
    )


def _add_profile(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--profile",
        action="store_true",
        help=f"after the timed runs, run pagedllm on {what} under torch.profiler and report "
        "its top ops by device time (CPU time without a GPU)",
    )


def _add_throughput(benchmarks: argparse._SubParsersAction) -> None:
    parser = benchmarks.add_parser(
        "throughput",
        help="requests and tokens per second over many requests",
        description="Offline throughput: all requests at once, each generating exactly its "
        "output length (ignore_eos). The hf peer sorts requests by output length, cuts them "
        "into --hf-batch-size batches and generates each batch's longest output; only the "
        "requested tokens count.",
    )
    parser.add_argument("--num-prompts", type=int, default=256)
    parser.add_argument("--input-len", default="32:512", help="N or LOW:HIGH (uniform)")
    parser.add_argument("--output-len", default="32:256", help="N or LOW:HIGH (uniform)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 greedy, e.g. 0.8")
    parser.add_argument("--hf-batch-size", type=int, default=16)
    parser.add_argument(
        "--num-warmup-prompts",
        type=int,
        default=0,
        help="untimed requests (fresh random prompts of the same lengths) that pagedllm and "
        "the hf peer run after loading, before the timed job, so that one-time work (Triton "
        "compiling a kernel for a new shape, a library's first calls) is not timed "
        "(default 0)",
    )
    parser.add_argument(
        "--hf-num-prompts",
        type=int,
        default=None,
        help="the hf peer runs only the first N requests (a random sample of the same job; "
        "its rates stand for the whole, as it runs batch by batch): for models where "
        "transformers would take minutes (default: all)",
    )
    _add_profile(parser, "up to 32 more requests of fresh prompts, each of at most 64 tokens")
    _add_backend(parser, THROUGHPUT_BACKENDS, "all")
    _add_common(parser)
    _add_model_args(parser)
    parser.set_defaults(func=_run_throughput)


def _add_latency(benchmarks: argparse._SubParsersAction) -> None:
    parser = benchmarks.add_parser(
        "latency",
        help="time to first token, time per output token, end-to-end latency of one batch",
        description="Latency of one batch of equal-length requests (greedy, ignore_eos) over "
        "repeated runs, and decode tokens/s against the memory-bandwidth bound "
        "(read bandwidth / weight bytes, per step).",
    )
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--num-iters", type=int, default=5)
    parser.add_argument("--num-warmup", type=int, default=1)
    parser.add_argument(
        "--bandwidth-mb", type=int, default=512, help="size of the bandwidth test tensor"
    )
    _add_profile(parser, "one more batch of fresh prompts")
    _add_backend(parser, LATENCY_BACKENDS, "pagedllm")
    _add_common(parser)
    _add_model_args(parser)
    parser.set_defaults(func=_run_latency)


def _add_spec_decode(benchmarks: argparse._SubParsersAction) -> None:
    parser = benchmarks.add_parser(
        "spec-decode",
        help="n-gram speculative decoding against none, on prompts that copy and that do not",
        description="Greedy tokens/s of one request with and without --speculative-config "
        "(default: n-gram, 4 draft tokens from 3- and 4-gram matches) on three fixed "
        "prompts, engines alternating; the accepted drafts, and whether the tokens match.",
    )
    parser.add_argument("--output-len", type=int, default=200)
    parser.add_argument("--num-iters", type=int, default=3)
    _add_common(parser)
    _add_model_args(parser)
    parser.set_defaults(func=_run_spec_decode)


def _add_lora(benchmarks: argparse._SubParsersAction) -> None:
    parser = benchmarks.add_parser(
        "lora",
        help="what serving LoRA adapters costs: base rows, one adapter, two adapters",
        description="Output tokens/s of a batch of greedy requests on an engine without "
        "LoRA and on one with enable_lora: base rows, every row with one random adapter, "
        "half the rows with each of two; rounds alternate, best of --num-iters.",
    )
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--lora-rank", type=int, default=16, choices=MAX_LORA_RANKS)
    parser.add_argument("--num-iters", type=int, default=3)
    _add_common(parser)
    _add_model_args(parser)
    parser.set_defaults(func=_run_lora)


def _add_perplexity(benchmarks: argparse._SubParsersAction) -> None:
    parser = benchmarks.add_parser(
        "perplexity",
        help="perplexity of the model on a fixed English text",
        description="exp(mean negative log-likelihood) of each token of the text given the "
        "tokens before it in its window (consecutive windows of --window tokens; a window's "
        "first token is not scored), from the engine's prompt logprobs.",
    )
    parser.add_argument(
        "--text",
        default=None,
        help="UTF-8 text file (default: tests/fixtures/perplexity.txt, 2,843 SmolLM2 tokens)",
    )
    parser.add_argument("--window", type=int, default=512, help="tokens per window")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON here")
    _add_model_args(parser)
    parser.set_defaults(func=_run_perplexity)


def _add_serve(benchmarks: argparse._SubParsersAction) -> None:
    parser = benchmarks.add_parser(
        "serve",
        help="load a running OpenAI-compatible server with streaming completions",
        description="Poisson arrivals of streaming /v1/completions requests; reports TTFT, "
        "TPOT, ITL, E2E latency and request and token throughput.",
    )
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default=None, help="model name (default: first of /v1/models)")
    parser.add_argument("--request-rate", type=float, default=float("inf"), help="req/s or inf")
    parser.add_argument("--num-prompts", type=int, default=100)
    parser.add_argument("--input-len", default="32:512", help="N or LOW:HIGH (uniform)")
    parser.add_argument("--output-len", default="32:256", help="N or LOW:HIGH (uniform)")
    parser.add_argument(
        "--vocab-size", type=int, default=10000, help="prompt token ids are drawn below this"
    )
    _add_common(parser)
    parser.set_defaults(func=_run_serve)


def _add_linear(benchmarks: argparse._SubParsersAction) -> None:
    parser = benchmarks.add_parser(
        "linear",
        help="GFLOP/s of the unquantized linear kernel against F.linear",
        description="skinny_gemm (a build, on weights packed as the loader packs them for it) "
        "against F.linear on the same matrices, in alternating rounds in one process; few "
        "rows stream the weights from memory, as a decode step does.",
    )
    parser.add_argument("--rows", default="1,16,64,256,512,2048", help="row counts of x")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--isa", default=None, help="a skinny_gemm build (default: the best)")
    parser.add_argument("--shapes", default=DEFAULT_SHAPES, help="weights NxK,NxK,...")
    parser.add_argument("--weight-mb", type=int, default=512, help="copies of the weights")
    parser.add_argument("--rounds", type=int, default=3, help="best of this many each")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON here")
    parser.set_defaults(func=_run_linear)


def _add_report(benchmarks: argparse._SubParsersAction) -> None:
    parser = benchmarks.add_parser(
        "report",
        help="re-run BENCHMARKS.md's tables here and print them as markdown",
        description="Runs each table of BENCHMARKS.md (batch 1, time to first token, batch "
        "16, throughput in Q4_1, bf16 and float32, perplexity) as the `pagedllm bench` "
        "command it names, and prints the machine, the commands and their results.",
    )
    parser.add_argument("--only", default=None, help="the tables whose title contains this")
    parser.add_argument("--vllm-python", metavar="PATH", default=None, help="adds vLLM's rows")
    parser.add_argument("--output", metavar="FILE", default=None, help="write here, not stdout")
    parser.set_defaults(func=_run_report)


def _run_report(args: argparse.Namespace) -> None:
    text = run_report(args, _run_bench_argv)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text + "\n")
    else:
        print(text)


def _run_bench_argv(argv: list[str]) -> None:
    """`pagedllm bench ARGV`, in this process."""
    parser = argparse.ArgumentParser(prog="pagedllm")
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", *argv])
    args.func(args)


def parse_backends(text: str, choices: tuple[str, ...]) -> list[str]:
    """'all' -> every choice; 'a,b' -> [a, b] in the given order."""
    names = list(choices) if text == "all" else [n.strip() for n in text.split(",")]
    bad = [n for n in names if n not in choices]
    if bad or not names:
        raise ValueError(f"--backend {text!r}: use one of {', '.join(choices)}, a list, or all")
    return list(dict.fromkeys(names))


def backends_of(args: argparse.Namespace, choices: tuple[str, ...]) -> list[str]:
    """parse_backends of --backend, with vLLM's flags checked before any backend runs."""
    backends = parse_backends(args.backend, choices)
    if "vllm" in backends:
        vllm_peer(args)
        check_vllm_python(args.vllm_python, named=args.backend != "all")
    return backends


def _emit(report: dict, text: str, json_path: str | None) -> None:
    print(text)
    _write_json(report, json_path)


def _write_json(report: dict, json_path: str | None) -> None:
    if json_path:
        with open(json_path, "w") as f:
            json.dump(report, f, indent=2)


def on_gguf_copy(args: argparse.Namespace) -> argparse.Namespace:
    """With --gguf-type, the same arguments with --model the cached copy of the GGUF model
    in that type (gguf_copy.py), so every backend loads the copy."""
    if args.gguf_type is None:
        return args
    source = args.model or default_model_path()
    if not source.endswith(".gguf"):
        raise ValueError(f"--gguf-type {args.gguf_type} needs a .gguf model, got {source!r}")
    copy = gguf_copy_path(source, GGUF_TYPES[args.gguf_type])
    return argparse.Namespace(**{**vars(args), "model": copy})


def _run_throughput(args: argparse.Namespace) -> None:
    args = on_gguf_copy(args)
    # The JSON is rewritten after each backend: a run cut short keeps what it measured.
    partial = functools.partial(_write_json, json_path=args.json)
    report = run_throughput(args, backends_of(args, THROUGHPUT_BACKENDS), partial)
    _emit(report, format_throughput(report), args.json)


def _run_latency(args: argparse.Namespace) -> None:
    args = on_gguf_copy(args)
    report = run_latency(args, backends_of(args, LATENCY_BACKENDS))
    _emit(report, format_latency(report), args.json)


def _run_spec_decode(args: argparse.Namespace) -> None:
    report = run_spec_decode(on_gguf_copy(args))
    _emit(report, format_spec_decode(report), args.json)


def _run_lora(args: argparse.Namespace) -> None:
    report = run_lora(on_gguf_copy(args))
    _emit(report, format_lora(report), args.json)


def _run_perplexity(args: argparse.Namespace) -> None:
    report = run_perplexity(on_gguf_copy(args))
    _emit(report, format_perplexity(report), args.json)


def _run_serve(args: argparse.Namespace) -> None:
    report = run_serve(args)
    _emit(report, format_serve(report), args.json)


def _run_linear(args: argparse.Namespace) -> None:
    report = run_linear(args)
    _emit(report, format_linear(report), args.json)
