"""What every benchmark reports: throughput of a run, latency statistics over runs."""

import gc
from dataclasses import asdict, dataclass

import numpy as np
import torch

PERCENTILES = (50, 90, 99)


def free_backend_memory() -> None:
    """Between two backends of one run: what the last one held goes (its objects, and on a
    GPU the blocks torch's allocator keeps cached, CUDA graphs' pools among them), so the
    next one loads into the whole device, as it would alone."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class BackendUnavailable(Exception):
    """A peer backend cannot run here (not installed, unsupported model); the message says why
    and is printed as a 'skipped: ...' line instead of results."""


CPU_ONLY_PEERS = ("llama.cpp", "vllm")
"""The peers as installed for the bench (llama-cpp-python's and vLLM's CPU builds)."""


def check_same_device(backend: str, device: str) -> None:
    """A CPU-only peer is skipped when pagedllm runs on another device: a ratio across
    devices would measure the hardware, not the engines."""
    if backend in CPU_ONLY_PEERS and device.split(":")[0] != "cpu":
        raise BackendUnavailable(
            f"skipped: {backend} runs on the CPU only and pagedllm on {device}; "
            "on that device the hf peer is the one to compare with"
        )


@dataclass
class ThroughputResult:
    """One backend's run over all requests. Tokens are those the requests asked for, counted
    from what the backend returned; elapsed_s excludes start-up (loading weights). detail says
    what the backend ran where the report's config line does not (e.g. a peer's own dtype)."""

    backend: str
    num_requests: int
    input_tokens: int
    output_tokens: int
    elapsed_s: float
    startup_s: float
    detail: str = ""
    profile: dict | None = None  # profile.profile_summary of a further run, if asked
    steps: int | None = None  # pagedllm's engine steps in the run (one engine)

    @property
    def requests_per_s(self) -> float:
        return self.num_requests / self.elapsed_s

    @property
    def total_tokens_per_s(self) -> float:
        return (self.input_tokens + self.output_tokens) / self.elapsed_s

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.elapsed_s

    def to_dict(self) -> dict:
        rates = {
            "requests_per_s": self.requests_per_s,
            "total_tokens_per_s": self.total_tokens_per_s,
            "output_tokens_per_s": self.output_tokens_per_s,
        }
        return asdict(self) | rates


THROUGHPUT_RATES = ("requests_per_s", "total_tokens_per_s", "output_tokens_per_s")


def ratios(ours: ThroughputResult, peer: ThroughputResult) -> dict[str, float]:
    """pagedllm / peer for each rate: above 1 means pagedllm is faster."""
    return {k: getattr(ours, k) / getattr(peer, k) for k in THROUGHPUT_RATES}


def summarize(values: list[float]) -> dict[str, float]:
    """mean and the PERCENTILES (linear interpolation, so p50 <= p90 <= p99) of `values`."""
    data = np.asarray(values, dtype=np.float64)
    stats = {"mean": float(data.mean())}
    stats |= {f"p{p}": float(np.percentile(data, p)) for p in PERCENTILES}
    return stats


@dataclass
class LatencySample:
    """One timed run of a batch, in seconds from its start: ttft_s is the mean over the batch
    of the time to a request's first token, tpot_s the mean time per later output token, and
    e2e_s the time until the whole batch is done."""

    ttft_s: float
    tpot_s: float
    e2e_s: float


def latency_sample(
    first_token_s: list[float], finish_s: list[float], output_len: int
) -> LatencySample:
    """From each request's first-token and finish times (seconds since the batch started)."""
    tpots = [(end - first) / (output_len - 1) for first, end in zip(first_token_s, finish_s)]
    n = len(first_token_s)
    return LatencySample(sum(first_token_s) / n, sum(tpots) / n, max(finish_s))
