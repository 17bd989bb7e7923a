"""`pagedllm bench throughput`: many random requests at once, pagedllm against its peers.

Every backend gets the same requests (seeded random token prompts), must produce exactly
the requested number of tokens each (ignore_eos), and is timed after it has loaded.
"""

import argparse
import time
from collections.abc import Callable

import torch

from pagedllm.benchmarks.datasets import BenchRequest, parse_len_range, random_requests
from pagedllm.benchmarks.hf_backend import run_hf_throughput
from pagedllm.benchmarks.llamacpp_backend import require_llama_cpp, run_llamacpp_throughput
from pagedllm.benchmarks.metrics import (
    THROUGHPUT_RATES,
    BackendUnavailable,
    ThroughputResult,
    check_same_device,
    free_backend_memory,
    ratios,
)
from pagedllm.benchmarks.profile import format_profile, profile_summary
from pagedllm.benchmarks.vllm_backend import run_vllm_throughput, vllm_peer
from pagedllm.config import ModelConfig
from pagedllm.engine.arg_utils import EngineArgs
from pagedllm.llm import LLM
from pagedllm.sampling_params import SamplingParams

THROUGHPUT_BACKENDS = ("pagedllm", "hf", "llama.cpp", "vllm")
# The profiled run's requests stop at this many output tokens: its steps show where the time
# goes as well as all of them would, and a GPU profile of a large model's full run (every
# kernel of every step an event) takes torch.profiler longer to summarize than to run.
PROFILE_MAX_OUTPUT = 64


def run_pagedllm_throughput(
    engine_args: EngineArgs,
    requests: list[BenchRequest],
    temperature: float,
    profile_requests: list[BenchRequest] | None = None,
    warmup_requests: list[BenchRequest] | None = None,
) -> ThroughputResult:
    """warmup_requests run untimed before the job; profile_requests after it, under
    torch.profiler."""
    start = time.perf_counter()
    llm = LLM(**vars(engine_args))
    startup = time.perf_counter() - start

    def generate(batch: list[BenchRequest]) -> list:
        prompts = [{"prompt_token_ids": r.prompt_token_ids} for r in batch]
        params = [
            SamplingParams(temperature=temperature, max_tokens=r.output_len, ignore_eos=True)
            for r in batch
        ]
        return llm.generate(prompts, params, use_tqdm=False)

    if warmup_requests:
        generate(warmup_requests)
    steps_before = _engine_steps(llm)
    start = time.perf_counter()
    outputs = generate(requests)
    elapsed = time.perf_counter() - start
    steps = None if steps_before is None else _engine_steps(llm) - steps_before
    input_tokens = sum(len(o.prompt_token_ids) for o in outputs)
    output_tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    profile = (
        None if profile_requests is None else profile_summary(lambda: generate(profile_requests))
    )
    # On a shape whose forward costs next to nothing (--hf-overrides), the time a step is
    # the host's: scheduling, the batch's inputs, sampling and the outputs.
    detail = f"{steps} engine steps, {1e3 * elapsed / steps:.3f} ms a step" if steps else ""
    if llm.llm_engine.config.scheduler_config.async_scheduling:
        detail += ", async scheduling"
    return ThroughputResult(
        "pagedllm",
        len(requests),
        input_tokens,
        output_tokens,
        elapsed,
        startup,
        detail,
        profile=profile,
        steps=steps,
    )


def _engine_steps(llm: LLM) -> int | None:
    """Steps the engine has run (the count of its tokens-a-step histogram); None for more
    engines than one (data parallelism), whose steps overlap."""
    stats = llm.llm_engine.get_stats_per_engine()
    return sum(stats[0].iteration_tokens.counts) if len(stats) == 1 else None


def fresh_requests(
    args: argparse.Namespace, model_config: ModelConfig, count: int, seed_offset: int
) -> list[BenchRequest]:
    """`count` requests of the job's length ranges on other prompts (seed + seed_offset),
    which the prefix cache cannot answer from the job's; none for a count of 0."""
    if count == 0:
        return []
    return random_requests(
        count,
        parse_len_range(args.input_len, "--input-len"),
        parse_len_range(args.output_len, "--output-len"),
        model_config.vocab_size,
        args.seed + seed_offset,
    )


def _run_backend(
    backend: str,
    args: argparse.Namespace,
    model_config: ModelConfig,
    requests: list[BenchRequest],
    device: str,
) -> ThroughputResult:
    """device: the engine's, resolved (never "auto")."""
    check_same_device(backend, device)
    warmup = fresh_requests(args, model_config, getattr(args, "num_warmup_prompts", 0), 2)
    if backend == "pagedllm":
        profile_requests = None
        if getattr(args, "profile", False):  # fresh prompts: the prefix cache must not skip them
            profile_requests = [
                BenchRequest(r.prompt_token_ids, min(r.output_len, PROFILE_MAX_OUTPUT))
                for r in fresh_requests(args, model_config, min(32, len(requests)), 1)
            ]
        return run_pagedllm_throughput(
            EngineArgs.from_cli_args(args), requests, args.temperature, profile_requests, warmup
        )
    if backend == "hf":
        sample = requests[: args.hf_num_prompts or None]
        result = run_hf_throughput(
            model_config, sample, args.hf_batch_size, args.temperature, device, warmup
        )
        if len(sample) < len(requests):  # the requests are random, so any prefix samples them
            result.detail = (
                f"ran the first {len(sample)} of the {len(requests)} requests "
                "(--hf-num-prompts); its rates stand for the whole job, which it runs batch "
                "by batch"
            )
        return result
    if backend == "vllm":
        return run_vllm_throughput(vllm_peer(args), model_config, requests, args.temperature)
    require_llama_cpp()
    return run_llamacpp_throughput(
        model_config, requests, args.temperature, torch.get_num_threads()
    )


def run_throughput(
    args: argparse.Namespace,
    backends: list[str],
    partial: Callable[[dict], None] | None = None,
) -> dict:
    """The report; `partial` gets it so far after each backend."""
    if args.temperature < 0:
        raise ValueError(f"--temperature {args.temperature} must be >= 0")
    if getattr(args, "hf_num_prompts", None) is not None and args.hf_num_prompts < 1:
        raise ValueError(f"--hf-num-prompts {args.hf_num_prompts} must be >= 1")
    if getattr(args, "num_warmup_prompts", 0) < 0:
        raise ValueError(f"--num-warmup-prompts {args.num_warmup_prompts} must be >= 0")
    engine_config = EngineArgs.from_cli_args(args).create_engine_config()
    model_config = engine_config.model_config
    input_len = parse_len_range(args.input_len, "--input-len")
    output_len = parse_len_range(args.output_len, "--output-len")
    requests = random_requests(
        args.num_prompts, input_len, output_len, model_config.vocab_size, args.seed
    )
    config = _config(args, model_config, input_len, output_len)
    results: dict[str, dict] = {}
    measured: dict[str, ThroughputResult] = {}
    for backend in backends:
        try:
            measured[backend] = _run_backend(
                backend, args, model_config, requests, engine_config.device
            )
            results[backend] = measured[backend].to_dict()
        except BackendUnavailable as e:
            results[backend] = {"skipped": str(e)}
        free_backend_memory()
        if partial is not None:
            partial(_report(config, results, measured))
    return _report(config, results, measured)


def _config(
    args: argparse.Namespace,
    model_config: ModelConfig,
    input_len: tuple[int, int],
    output_len: tuple[int, int],
) -> dict:
    config = {
        "model": model_config.model,
        "dtype": str(model_config.dtype).removeprefix("torch."),
        "quantization": model_config.quantization or "none",
        "threads": torch.get_num_threads(),
        "input_len": list(input_len),
        "output_len": list(output_len),
    }
    names = ("num_prompts", "temperature", "seed", "hf_batch_size")
    config |= {k: getattr(args, k) for k in names}
    return config | {k: getattr(args, k, None) for k in ("hf_num_prompts", "num_warmup_prompts")}


def _report(config: dict, results: dict, measured: dict[str, ThroughputResult]) -> dict:
    """pagedllm's results and each peer's, with pagedllm's ratios to each peer measured."""
    ours = measured.get("pagedllm")
    peers = {name: peer for name, peer in measured.items() if name != "pagedllm"}
    peer_ratios = {name: ratios(ours, peer) for name, peer in peers.items()} if ours else {}
    results = dict(results)  # as it is now: later backends add to the caller's
    return {"benchmark": "throughput", "config": config, "results": results, "ratios": peer_ratios}


_COLUMNS = ("requests/s", "total tok/s", "output tok/s", "input tok", "output tok", "elapsed s")


def format_throughput(report: dict) -> str:
    c = report["config"]
    lines = [
        f"model {c['model']} ({c['dtype']}, quantization {c['quantization']}, "
        f"{c['threads']} threads), {c['num_prompts']} prompts, "
        f"input {c['input_len'][0]}:{c['input_len'][1]}, output "
        f"{c['output_len'][0]}:{c['output_len'][1]}, temperature {c['temperature']}"
        + (f", after {c['num_warmup_prompts']} warm-up" if c.get("num_warmup_prompts") else ""),
        f"{'backend':<20}" + "".join(f"{name:>14}" for name in _COLUMNS) + f"{'start-up s':>14}",
    ]
    for backend, r in report["results"].items():
        if "skipped" in r:
            lines.append(f"{backend:<20}{r['skipped']}")
            continue
        rates = "".join(f"{r[k]:>14.4g}" for k in THROUGHPUT_RATES)
        counts = f"{r['input_tokens']:>14d}{r['output_tokens']:>14d}"
        lines.append(f"{backend:<20}{rates}{counts}{r['elapsed_s']:>14.2f}{r['startup_s']:>14.2f}")
    for peer, peer_ratios in report["ratios"].items():
        cells = "".join(f"{peer_ratios[k]:>13.3f}x" for k in THROUGHPUT_RATES)
        lines.append(f"{'pagedllm/' + peer:<20}{cells}")
    details = [f"{b}: {r['detail']}" for b, r in report["results"].items() if r.get("detail")]
    for backend, r in report["results"].items():
        if r.get("profile"):
            details += [f"{backend}:", *format_profile(r["profile"])]
    return "\n".join(lines + details)
