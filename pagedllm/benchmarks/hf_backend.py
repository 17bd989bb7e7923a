"""The transformers peer: `generate` on exactly pagedllm's weights and dtype.

The model is built from the same ModelConfig (so a GGUF loads through pagedllm's dequantizer;
transformers' own GGUF path needs `accelerate`) with sdpa attention; a quantized model's weights
are dequantized to the dtype (transformers has no GGUF kernels). Batches are left-padded,
and min_new_tokens = max_new_tokens makes every row generate the asked length, as ignore_eos
does for pagedllm.

transformers' modeling stack is imported when the peer is loaded: importing it pulls in
torch.compile's (1.9 s), which every `pagedllm` command would otherwise pay at start.
"""

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from transformers.generation.streamers import BaseStreamer

from pagedllm.benchmarks.datasets import BenchRequest
from pagedllm.benchmarks.metrics import LatencySample, ThroughputResult, latency_sample
from pagedllm.config import ModelConfig
from pagedllm.model_loader.loader import iterate_weights

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def load_hf_model(model_config: ModelConfig, device: str = "cpu") -> "PreTrainedModel":
    """transformers' model of `model_config` on `device` (the engine's, so that a ratio
    compares the two on the same hardware); with load_format "dummy", random weights of its
    shapes, as the engine's."""
    from transformers import AutoModelForCausalLM

    hf_config = model_config.hf_config
    if model_config.load_format == "dummy":  # random weights of the shape, made on the device
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(
                hf_config, dtype=model_config.dtype, attn_implementation="sdpa"
            )
        return model.eval()
    model = AutoModelForCausalLM.from_config(
        hf_config, dtype=model_config.dtype, attn_implementation="sdpa"
    )
    missing, unexpected = model.load_state_dict(dict(iterate_weights(model_config)), strict=False)
    tied = {"lm_head.weight"} if getattr(hf_config, "tie_word_embeddings", False) else set()
    if unexpected or set(missing) - tied:
        raise ValueError(
            f"weights of {model_config.model!r} do not fit transformers' "
            f"{model_config.architecture}: missing {sorted(set(missing) - tied)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]}"
        )
    return model.to(device).eval()


def _pad_token_id(model: "PreTrainedModel") -> int:
    config = model.config
    for candidate in (config.pad_token_id, config.eos_token_id, 0):
        candidate = candidate[0] if isinstance(candidate, list) else candidate
        if candidate is not None:
            return candidate
    raise AssertionError("unreachable: 0 is a candidate")


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids [B, L], attention_mask [B, L]) with each prompt right-aligned."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, prompt in enumerate(prompts):
        ids[i, width - len(prompt) :] = torch.tensor(prompt)
        mask[i, width - len(prompt) :] = 1
    return ids, mask


@torch.inference_mode()
def generate_batch(
    model: "PreTrainedModel",
    batch: list[BenchRequest],
    num_tokens: int,
    temperature: float,
    streamer: BaseStreamer | None = None,
) -> torch.Tensor:
    """The new tokens [B, num_tokens] of every request in the batch."""
    ids, mask = left_pad([r.prompt_token_ids for r in batch], _pad_token_id(model))
    ids, mask = ids.to(model.device), mask.to(model.device)
    sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=num_tokens,
        min_new_tokens=num_tokens,
        pad_token_id=_pad_token_id(model),
        streamer=streamer,
        **(sampling if temperature > 0 else {"do_sample": False}),
    )
    new_tokens = out[:, ids.shape[1] :]
    assert new_tokens.shape == (len(batch), num_tokens), new_tokens.shape
    return new_tokens


def batches_by_output_len(
    requests: list[BenchRequest], batch_size: int
) -> Iterator[list[BenchRequest]]:
    """Requests sorted by output length, then cut into batches, so a batch's rows want
    similar lengths and little is generated beyond what was asked."""
    ordered = sorted(requests, key=lambda r: r.output_len)
    for start in range(0, len(ordered), batch_size):
        yield ordered[start : start + batch_size]


def run_hf_throughput(
    model_config: ModelConfig,
    requests: list[BenchRequest],
    batch_size: int,
    temperature: float,
    device: str = "cpu",
    warmup: list[BenchRequest] | None = None,
) -> ThroughputResult:
    """Each batch generates its longest requested output; only the requested tokens count.
    The warmup requests run first, untimed, in batches as the job's."""
    if batch_size < 1:
        raise ValueError(f"hf batch size {batch_size} must be >= 1")
    start = time.perf_counter()
    model = load_hf_model(model_config, device)
    startup = time.perf_counter() - start
    _generate_in_batches(model, warmup or [], batch_size, temperature)
    start = time.perf_counter()
    output_tokens = _generate_in_batches(model, requests, batch_size, temperature)
    elapsed = time.perf_counter() - start
    input_tokens = sum(r.prompt_len for r in requests)
    return ThroughputResult("hf", len(requests), input_tokens, output_tokens, elapsed, startup)


def _generate_in_batches(
    model: "PreTrainedModel", requests: list[BenchRequest], batch_size: int, temperature: float
) -> int:
    """Each batch to its longest requested output -> the tokens the requests asked for."""
    for batch in batches_by_output_len(requests, batch_size):
        generate_batch(model, batch, max(r.output_len for r in batch), temperature)
    return sum(r.output_len for r in requests)


class _TimingStreamer(BaseStreamer):
    """Times generate's pushes: the first is the prompt, then one per new token (all rows)."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def put(self, value: torch.Tensor) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        self.times.append(time.perf_counter())


def hf_latency_sample(model: "PreTrainedModel", batch: list[BenchRequest]) -> LatencySample:
    """One greedy run of the batch; every row gets its first token at the same time."""
    output_len = batch[0].output_len
    streamer = _TimingStreamer()
    start = time.perf_counter()
    generate_batch(model, batch, output_len, 0.0, streamer)
    first, finish = streamer.times[1] - start, streamer.times[-1] - start
    return latency_sample([first] * len(batch), [finish] * len(batch), output_len)
