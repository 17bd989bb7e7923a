"""`pagedllm bench latency`: time to first token, time per output token and end-to-end time
of one batch over repeated runs after warm-up, and decode speed against the bandwidth bound.

Each run gets fresh random prompts, so prefix caching cannot skip a prefill.
"""

import argparse
import functools
import itertools
import statistics
import time
from collections.abc import Callable

import torch

from pagedllm.benchmarks.bandwidth import (
    ReadBandwidthProbe,
    decode_bound_tokens_per_s,
    model_weight_bytes,
)
from pagedllm.benchmarks.datasets import BenchRequest, random_requests
from pagedllm.benchmarks.hf_backend import hf_latency_sample, load_hf_model
from pagedllm.benchmarks.llamacpp_backend import llamacpp_latency_sample, load_llama
from pagedllm.benchmarks.metrics import (
    BackendUnavailable,
    LatencySample,
    check_same_device,
    free_backend_memory,
    latency_sample,
    summarize,
)
from pagedllm.benchmarks.profile import format_profile, profile_summary
from pagedllm.benchmarks.vllm_backend import run_vllm_latency, vllm_peer
from pagedllm.config import ModelConfig, resolve_device
from pagedllm.engine.arg_utils import EngineArgs
from pagedllm.engine.llm_engine import LLMEngine
from pagedllm.sampling_params import RequestOutputKind, SamplingParams

Runner = Callable[[list[BenchRequest]], LatencySample]
LATENCY_BACKENDS = ("pagedllm", "hf", "llama.cpp", "vllm")


def pagedllm_latency_sample(
    engine: LLMEngine, batch: list[BenchRequest], tag: str
) -> LatencySample:
    """Add the batch, step until done; a request's first token is its first non-empty delta."""
    start = time.perf_counter()
    ids = [f"{tag}-{i}" for i in range(len(batch))]
    for request_id, request in zip(ids, batch):
        params = SamplingParams(
            temperature=0.0,
            max_tokens=request.output_len,
            ignore_eos=True,
            output_kind=RequestOutputKind.DELTA,
        )
        engine.add_request(request_id, {"prompt_token_ids": request.prompt_token_ids}, params)
    first, finish = {}, {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            now = time.perf_counter() - start
            if output.outputs[0].token_ids:
                first.setdefault(output.request_id, now)
            if output.finished:
                finish[output.request_id] = now
    return latency_sample([first[i] for i in ids], [finish[i] for i in ids], batch[0].output_len)


def _pagedllm_runner(args: argparse.Namespace, model_config: ModelConfig) -> Runner:
    engine = LLMEngine.from_engine_args(EngineArgs.from_cli_args(args))
    tags = itertools.count()
    return lambda batch: pagedllm_latency_sample(engine, batch, f"latency-{next(tags)}")


def _hf_runner(args: argparse.Namespace, model_config: ModelConfig) -> Runner:
    model = load_hf_model(model_config, resolve_device(args.device))
    return lambda batch: hf_latency_sample(model, batch)


def _llamacpp_runner(args: argparse.Namespace, model_config: ModelConfig) -> Runner:
    if args.batch_size != 1:
        raise BackendUnavailable("skipped: llama-cpp-python runs one sequence; use --batch-size 1")
    llm = load_llama(model_config, args.input_len + args.output_len, torch.get_num_threads())
    return lambda batch: llamacpp_latency_sample(llm, batch[0])


_RUNNERS = {"pagedllm": _pagedllm_runner, "hf": _hf_runner, "llama.cpp": _llamacpp_runner}


def _timed_runs(
    backend: str,
    args: argparse.Namespace,
    model_config: ModelConfig,
    batches: list[list[BenchRequest]],
    probe: Callable[[], float],
    profile_batch: list[BenchRequest] | None = None,
) -> tuple[dict, list[LatencySample], list[float]]:
    """({"startup_s": loading time, maybe "detail", with profile_batch pagedllm's "profile"
    of it}, one sample per batch, the read bandwidth each ran at: the best of the probes
    just before and just after it; vLLM runs every batch in its own process, so its samples
    get the best of the probes before and after that)."""
    check_same_device(backend, resolve_device(args.device))
    if backend == "vllm":
        before = probe()
        loaded, samples = run_vllm_latency(vllm_peer(args), model_config, batches)
        return loaded, samples, [max(before, probe())] * len(samples)
    start = time.perf_counter()
    runner = _RUNNERS[backend](args, model_config)
    startup = time.perf_counter() - start
    probes, samples = [probe()], []
    for batch in batches:
        samples.append(runner(batch))
        probes.append(probe())
    loaded = {"startup_s": startup}
    if profile_batch is not None and backend == "pagedllm":
        loaded["profile"] = profile_summary(functools.partial(runner, profile_batch))
    del runner
    free_backend_memory()
    return loaded, samples, [max(a, b) for a, b in itertools.pairwise(probes)]


def run_backend(
    backend: str,
    args: argparse.Namespace,
    model_config: ModelConfig,
    batches: list[list[BenchRequest]],
    probe: Callable[[], float],
    model_bytes: int,
    profile_batch: list[BenchRequest] | None = None,
) -> dict:
    """Load the backend (timed as start-up), run every batch, keep those after warm-up.
    percent_of_bound is the median over the runs of each run's decode speed against the
    bound at the bandwidth probed around it."""
    loaded, samples, bandwidths = _timed_runs(
        backend, args, model_config, batches, probe, profile_batch
    )
    samples, bandwidths = samples[args.num_warmup :], bandwidths[args.num_warmup :]
    bounds = [decode_bound_tokens_per_s(bw, model_bytes, args.batch_size) for bw in bandwidths]
    percents = [
        100 * args.batch_size / s.tpot_s / bound for s, bound in zip(samples, bounds, strict=True)
    ]
    return loaded | {
        "ttft_s": summarize([s.ttft_s for s in samples]),
        "tpot_s": summarize([s.tpot_s for s in samples]),
        "e2e_s": summarize([s.e2e_s for s in samples]),
        "decode_tokens_per_s": args.batch_size / summarize([s.tpot_s for s in samples])["mean"],
        "bandwidths_bytes_per_s": bandwidths,
        "percent_of_bound": statistics.median(percents),
    }


def check_latency_args(args: argparse.Namespace) -> None:
    limits = {"batch_size": 1, "input_len": 1, "output_len": 2, "num_iters": 1, "num_warmup": 0}
    for name, low in limits.items():
        if getattr(args, name) < low:
            flag = "--" + name.replace("_", "-")
            raise ValueError(f"{flag} {getattr(args, name)} must be >= {low}")
    if args.bandwidth_mb < 1:
        raise ValueError(f"--bandwidth-mb {args.bandwidth_mb} must be >= 1")


def run_latency(args: argparse.Namespace, backends: list[str]) -> dict:
    check_latency_args(args)
    engine_config = EngineArgs.from_cli_args(args).create_engine_config()
    model_config, device = engine_config.model_config, engine_config.device
    lens = (args.input_len, args.input_len), (args.output_len, args.output_len)
    batches = [
        random_requests(args.batch_size, *lens, model_config.vocab_size, args.seed + i)
        for i in range(args.num_warmup + args.num_iters)
    ]
    profile_batch = None
    if getattr(args, "profile", False):  # fresh prompts: the prefix cache must not skip them
        profile_batch = random_requests(
            args.batch_size, *lens, model_config.vocab_size, args.seed + len(batches)
        )
    all_bytes, model_bytes = model_weight_bytes(model_config, args.batch_size)
    read_bandwidth, probed = ReadBandwidthProbe(args.bandwidth_mb * 1024**2, device=device), []

    def probe() -> float:
        probed.append(read_bandwidth())
        return probed[-1]

    results = {}
    for backend in backends:
        try:
            results[backend] = run_backend(
                backend, args, model_config, batches, probe, model_bytes, profile_batch
            )
        except BackendUnavailable as e:
            results[backend] = {"skipped": str(e)}
    bandwidth = statistics.median(probed or [probe()])
    config = {
        "model": model_config.model,
        "dtype": str(model_config.dtype).removeprefix("torch."),
        "quantization": model_config.quantization or "none",
        "threads": torch.get_num_threads(),
        "device": device,
    }
    config |= {k: getattr(args, k) for k in ("batch_size", "input_len", "output_len")}
    config |= {k: getattr(args, k) for k in ("num_iters", "num_warmup", "seed")}
    return {
        "benchmark": "latency",
        "config": config,
        "bandwidth_bytes_per_s": bandwidth,
        "bandwidth_probes_bytes_per_s": probed,
        "weight_bytes": all_bytes,
        "read_bytes_per_step": model_bytes,
        "bound_tokens_per_s": decode_bound_tokens_per_s(bandwidth, model_bytes, args.batch_size),
        "results": results,
    }


def format_latency(report: dict) -> str:
    c = report["config"]
    probes = report["bandwidth_probes_bytes_per_s"]
    lines = [
        f"model {c['model']} ({c['dtype']}, quantization {c['quantization']}, "
        f"{c['threads']} threads), batch {c['batch_size']}, "
        f"input {c['input_len']}, output {c['output_len']}: "
        f"{c['num_iters']} runs after {c['num_warmup']} warm-up",
        f"{c['device']} memory read bandwidth {report['bandwidth_bytes_per_s'] / 1e9:.2f} GB/s "
        f"(median of {len(probes)} probes around the runs, "
        f"{min(probes) / 1e9:.2f}-{max(probes) / 1e9:.2f}), "
        f"weights {report['weight_bytes'] / 1e6:.1f} MB{_active_share(report)} -> bandwidth bound "
        f"{report['bound_tokens_per_s']:.2f} tok/s at batch {c['batch_size']}",
    ]
    for backend, result in report["results"].items():
        lines += ["", f"[{backend}]"] + _format_result(result)
    return "\n".join(lines)


def _active_share(report: dict) -> str:
    """How much of the weights a step reads, where that is not all of them (a MoE model's
    unrouted experts, an untied input embedding's rows not looked up: decode_read_bytes)."""
    read, batch = report["read_bytes_per_step"], report["config"]["batch_size"]
    if read == report["weight_bytes"]:
        return ""
    return (
        f", {read / 1e6:.1f} MB read per step (the experts and embedding rows a batch of "
        f"{batch} uses)"
    )


def _format_result(result: dict) -> list[str]:
    if "skipped" in result:
        return [result["skipped"]]
    lines = [f"{'':<10}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}"]
    for name, key in (("TTFT ms", "ttft_s"), ("TPOT ms", "tpot_s"), ("E2E ms", "e2e_s")):
        stats = result[key]
        lines.append(f"{name:<10}" + "".join(f"{1000 * stats[k]:>10.2f}" for k in stats))
    lines.append(
        f"decode {result['decode_tokens_per_s']:.2f} tok/s; "
        f"{result['percent_of_bound']:.1f}% of the bandwidth bound (median over the runs, "
        "each against the bandwidth probed around it); "
        f"start-up {result['startup_s']:.2f} s"
    )
    lines += [result["detail"]] if "detail" in result else []
    return lines + (format_profile(result["profile"]) if "profile" in result else [])
