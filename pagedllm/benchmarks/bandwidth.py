"""The batch-1 decode bound: memory read bandwidth over the bytes of weights read per token.

At batch 1 every decode step reads every weight once and does little arithmetic per byte,
so no implementation can beat bandwidth / weight bytes tokens per second (KV reads and
activations only lower the bound further). A GGUF run as stored (quantization "gguf") reads
its tensors' bytes as they lie in the file; otherwise the weights are the model's parameters
in its dtype. A mixture-of-experts layer reads only the experts its tokens are routed to: at
batch 1, top_k of them (Qwen3-30B-A3B: 8 of 128, ~3.3 of its ~30.5 B parameters), so the
bound counts those, not the whole model. Likewise an input embedding that is not also the LM
head is looked up, not streamed: a step reads its batch's rows (Llama-3-8B's is 1 of its
16 GB).
"""

import time

import torch
from torch import nn

from pagedllm.config import ModelConfig
from pagedllm.cpu_memory import huge_page_map, huge_page_size
from pagedllm.layers.fused_moe import FusedMoE
from pagedllm.layers.vocab_embedding import ParallelLMHead, VocabParallelEmbedding
from pagedllm.model_loader.loader import build_model, weight_bytes


class ReadBandwidthProbe:
    """Bytes per second that `torch.sum` streams through a float32 tensor of `num_bytes` on
    `device` (the engine's: on a GPU the weights are read from its memory), best of
    `repeats` passes with torch's current thread count, each time it is called; each pass
    ends when its sum reaches the host, so an asynchronous device is timed whole.

    The tensor is allocated once and lies in transparent huge pages where the OS offers
    them, as the weight arena puts a model's weights: in 4 KiB pages the same pass reads
    10-15% slower, a bound below what the weights stream at. A shared host's bandwidth can
    also drift by up to 2x from one minute to the next, so the latency benchmark probes
    around every timed run rather than once. The tensor is made at the first call,
    after the first backend has started: its huge pages, faulted in while an engine was
    loading, made that start-up 0.5-1 s slower (the OS's huge-page faults grew costlier)."""

    def __init__(
        self, num_bytes: int = 512 * 1024**2, repeats: int = 10, device: str = "cpu"
    ) -> None:
        if num_bytes < 4 or repeats < 1:
            raise ValueError(f"num_bytes {num_bytes} must be >= 4 and repeats {repeats} >= 1")
        self.num_bytes, self.repeats, self.device = num_bytes, repeats, torch.device(device)
        self.data: torch.Tensor | None = None

    def __call__(self) -> float:
        if self.data is None:
            self.data = probe_tensor(self.num_bytes // 4, self.device)
        best = float("inf")
        for _ in range(self.repeats):
            start = time.perf_counter()
            torch.sum(self.data).item()
            best = min(best, time.perf_counter() - start)
        return self.data.numel() * 4 / best


def probe_tensor(numel: int, device: str | torch.device = "cpu") -> torch.Tensor:
    """numel float32 ones; on the CPU in a huge-page-aligned map that asks for huge pages
    where huge_page_size() is known, else (and on other devices) torch's own allocation."""
    page = huge_page_size()
    if torch.device(device).type != "cpu" or page is None:
        return torch.ones(numel, dtype=torch.float32, device=device)
    return huge_page_map(numel * 4, page).view(torch.float32).fill_(1.0)


def model_weight_bytes(model_config: ModelConfig, batch_size: int = 1) -> tuple[int, int]:
    """(bytes of all weights, bytes one decode step of `batch_size` sequences reads): the
    model's parameters as it holds them, built on the meta device (no memory) with each
    layer's quant method, so a GGUF run as stored counts its blocks and anything dequantized
    counts in its dtype; the two differ in MoE layers and untied input embeddings
    (decode_read_bytes)."""
    model = build_model(model_config, "meta")
    return weight_bytes(model, buffers=False), decode_read_bytes(model, batch_size)


def decode_read_bytes(model: nn.Module, batch_size: int = 1) -> int:
    """Every weight once, but of each FusedMoE layer's per-expert tensors (those whose first
    dimension is its experts) only the share of experts the batch is expected to route to,
    and of an input embedding that is not the LM head's weight too only `batch_size` rows."""
    total = weight_bytes(model, buffers=False) - _unread_embedding_bytes(model, batch_size)
    for module in model.modules():
        if not isinstance(module, FusedMoE):
            continue
        experts = module.local_num_experts
        per_expert = sum(
            p.numel() * p.element_size()
            for p in module.parameters(recurse=False)
            if p.dim() > 0 and p.shape[0] == experts
        )
        active = expected_active_experts(module.num_experts, module.top_k, batch_size)
        total -= round(per_expert * (1 - active / module.num_experts))
    return total


def _unread_embedding_bytes(model: nn.Module, batch_size: int) -> int:
    """Bytes of the input embeddings' rows a decode step does not look up (all but
    batch_size rows of each), where the LM head does not stream the same weight."""
    heads = {id(m.weight) for m in model.modules() if isinstance(m, ParallelLMHead)}
    unread = 0
    for module in model.modules():
        if type(module) is not VocabParallelEmbedding or id(module.weight) in heads:
            continue
        weight = module.weight
        rows = weight.shape[0]
        unread += weight.numel() * weight.element_size() * max(rows - batch_size, 0) // rows
    return unread


def expected_active_experts(num_experts: int, top_k: int, num_tokens: int) -> float:
    """Distinct experts `num_tokens` tokens route to, each to top_k of num_experts, if every
    token picks its experts uniformly and independently of the others: an expert is missed
    by one token with probability 1 - top_k / num_experts. Exactly top_k for one token."""
    return num_experts * (1 - (1 - top_k / num_experts) ** num_tokens)


def decode_bound_tokens_per_s(bandwidth: float, model_bytes: int, batch_size: int = 1) -> float:
    """Tokens/s if each step only streamed the weights once for the whole batch."""
    return batch_size * bandwidth / model_bytes
