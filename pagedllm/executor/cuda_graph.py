"""CUDA graphs for decode steps: each decode batch size's forward captured once, replayed.

A small model's decode step on a GPU is bound by kernel launches and the Python between
them, not by the GPU (the default model's ~300 kernels at batch 1). As vLLM does, the
decoder's forward (input ids to final hidden states; the LM head and the sampler run
eagerly after it) is captured at start-up for every size in `capture_sizes`, right after
the KV cache is allocated, and a pure-decode step of B sequences replays the smallest
captured size >= B.

- Inputs: one set of static device buffers (input ids, positions, slot mapping, sequence
  lengths, block tables as wide as max_model_len needs), sized for the largest capture;
  the graph of size s reads their first s rows. A step writes its rows into pinned host
  copies of them and copies each to the device once, without waiting (StaticDecodeInputs).
- Padding: rows B..s decode token 0 at position 0 into the KV cache's padding block, one
  block past those the scheduler hands out (the model runner allocates it), reading a
  one-token sequence there: they never touch a real sequence's cache.
- Lengths: a graph replays its kernels with the arguments they were recorded with, so the
  attention metadata's Python lengths must not shape them. Capture runs with every
  sequence at max_model_len on the host (max_seq_len, the bound a kernel may size its grid
  by, and RoPE's table); the real lengths are read from the device tensors. Only an
  attention backend that declares it works this way (`cudagraph_support`, backend.py) is
  captured; the torch reference is not (its decode gathers up to max_seq_len).
- Memory: sizes are captured largest first into one shared memory pool, so the smaller
  graphs reuse the larger ones' intermediate buffers; a replay's output lives in that pool
  and is read (by the LM head) before the next replay.
- Tensor parallelism: every rank runs the same decision and captures the same sizes in
  the same order (a graph belongs to its process; the collectives are captured in each).

`enforce_eager=True` turns graphs off; steps with a prefill, batches larger than the last
size and models whose forward reads the device on the host (`syncs_host`, FusedMoE's
per-expert counts) run eagerly.
"""

import bisect
import time
from collections.abc import Callable
from typing import Protocol

import torch
from torch import nn

from pagedllm.executor.batch import BatchInputs, write_placeholders
from pagedllm.executor.kv_cache import attention_layers
from pagedllm.forward_context import AttentionMetadata, set_forward_context
from pagedllm.layers.attention_backends.backend import AttentionCGSupport
from pagedllm.logger import init_logger
from pagedllm.lora.layers import current_lora_mapping

logger = init_logger(__name__)

_VLLM_CAPTURE_SIZES = (1, 2, 4, *range(8, 256, 8), *range(256, 513, 16))
"""vLLM's cudagraph_capture_sizes: 1, 2, 4, every 8 up to 248, then every 16 up to 512."""

_INPUTS = ("input_ids", "positions", "slot_mapping", "seq_lens", "block_tables")


def capture_sizes(max_num_seqs: int) -> list[int]:
    """vLLM's capture sizes up to the first that holds max_num_seqs decodes (at most 512)."""
    sizes = []
    for size in _VLLM_CAPTURE_SIZES:
        sizes.append(size)
        if size >= max_num_seqs:
            break
    return sizes


def unsupported_reason(model: nn.Module, device: torch.device, enforce_eager: bool) -> str | None:
    """Why this model's decode steps are not captured on `device`, or None if they are."""
    if device.type != "cuda":
        return f"{device.type} is not a CUDA device"
    if enforce_eager:
        return "enforce_eager is set"
    never = sorted(
        {
            layer.backend.name
            for layer in attention_layers(model)
            # A backend that does not say is not captured.
            if getattr(layer.backend, "cudagraph_support", AttentionCGSupport.NEVER)
            is AttentionCGSupport.NEVER
        }
    )
    if never:
        return f"attention backend {', '.join(never)} has no CUDA graph support"
    syncing = sorted({type(m).__name__ for m in model.modules() if getattr(m, "syncs_host", False)})
    if syncing:
        return f"{', '.join(syncing)} reads device tensors on the host in its forward"
    return None


class StaticDecodeInputs:
    """The inputs every graph reads, [max_size] rows (block tables [max_size, max_blocks]),
    and their host copies (pinned on a GPU) that each step fills before copying."""

    def __init__(
        self, max_size: int, max_blocks: int, pad_block: int, block_size: int, device: torch.device
    ) -> None:
        shapes = {name: (max_size,) for name in _INPUTS} | {"block_tables": (max_size, max_blocks)}
        dtypes = {"input_ids": torch.int64, "positions": torch.int64, "slot_mapping": torch.int64}
        pin = device.type == "cuda"
        self.host = {
            name: torch.zeros(shape, dtype=dtypes.get(name, torch.int32), pin_memory=pin)
            for name, shape in shapes.items()
        }
        self.device = {name: t.to(device, copy=True) for name, t in self.host.items()}
        self.query_start_loc = torch.arange(max_size + 1, dtype=torch.int32, device=device)
        self.pad_block = pad_block
        self.pad_slot = pad_block * block_size
        # The host copies are rewritten only after the last step's copies have run. They
        # have by then: they ran after the step before them, whose sampled tokens the host
        # has read back (the last step, or under async scheduling the one before it).
        self._copied = torch.cuda.Event() if device.type == "cuda" else None

    def load(self, batch: BatchInputs, size: int) -> None:
        """Rows [0, B) from the batch's B decodes, rows [B, size) padding, on the device."""
        if self._copied is not None:
            self._copied.synchronize()
        md, h = batch.attn_metadata, self.host
        b, width = md.num_seqs, md.block_tables.shape[1]
        h["input_ids"][:b] = batch.input_ids
        h["positions"][:b] = batch.positions
        h["slot_mapping"][:b] = md.slot_mapping
        h["seq_lens"][:b] = md.seq_lens
        h["block_tables"][:b, :width] = md.block_tables
        h["block_tables"][:b, width:] = 0
        self.pad(b, size)
        self.copy(size)

    def pad(self, start: int, end: int) -> None:
        """Host rows [start, end) as padding: token 0 at position 0 written to the padding
        block, whose first slot is the whole of a one-token sequence."""
        h = self.host
        for name in ("input_ids", "positions", "block_tables"):
            h[name][start:end] = 0
        h["slot_mapping"][start:end] = self.pad_slot
        h["seq_lens"][start:end] = 1
        h["block_tables"][start:end, 0] = self.pad_block

    def copy(self, size: int) -> None:
        """Host rows [0, size) to the device, without waiting."""
        for name in _INPUTS:
            self.device[name][:size].copy_(self.host[name][:size], non_blocking=True)
        if self._copied is not None:
            self._copied.record()

    def metadata(self, size: int, max_model_len: int) -> AttentionMetadata:
        """The forward context a graph of `size` rows is captured with: every row a decode,
        every length on the host max_model_len (the real ones are on the device)."""
        d = self.device
        return AttentionMetadata(
            slot_mapping=d["slot_mapping"][:size],
            query_start_loc=self.query_start_loc[: size + 1],
            seq_lens=d["seq_lens"][:size],
            block_tables=d["block_tables"][:size],
            query_lens_cpu=[1] * size,
            seq_lens_cpu=[max_model_len] * size,
        )


class Graph(Protocol):
    def replay(self) -> None: ...


Capture = Callable[[Callable[[], torch.Tensor]], tuple[Graph, torch.Tensor]]
"""Records a forward -> (the graph that reruns it, the output tensor each replay rewrites)."""


def cuda_capture(device: torch.device) -> Capture:
    """torch.cuda.graph captures sharing one memory pool. Errors are "thread_local": a sync
    in the captured forward fails its capture, while other threads' CUDA calls (NCCL's
    watchdog under tensor parallelism) go on."""
    pool = torch.cuda.graph_pool_handle()

    def capture(forward: Callable[[], torch.Tensor]) -> tuple[Graph, torch.Tensor]:
        torch.cuda.synchronize(device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
            output = forward()
        return graph, output

    return capture


class CudaGraphRunner:
    """Runs pure-decode steps of up to sizes[-1] sequences by replay.

    `run` returns the hidden states [B, hidden], or None when the step runs eagerly (a
    prefill in it, more sequences than the largest size)."""

    def __init__(
        self,
        model: nn.Module,
        sizes: list[int],
        max_model_len: int,
        block_size: int,
        pad_block: int,
        device: torch.device,
        capture: Capture | None = None,
    ) -> None:
        """pad_block: a KV cache block no sequence is given, for the padding rows; capture:
        how a forward is recorded (cuda_capture(device) by default)."""
        self.model = model
        self.sizes = sorted(sizes)
        self.max_model_len = max_model_len
        max_blocks = -(-max_model_len // block_size)
        self.inputs = StaticDecodeInputs(self.sizes[-1], max_blocks, pad_block, block_size, device)
        self.capture = capture or cuda_capture(device)
        self.graphs: dict[int, tuple[Graph, torch.Tensor]] = {}
        # What the graphs point into besides their pool, as it was at capture.
        self.kept = [*model.parameters(), *model.buffers()]

    @torch.inference_mode()
    def capture_all(self) -> None:
        """Captures every size, largest first (the smaller graphs reuse its pool memory)."""
        start = time.perf_counter()
        for size in reversed(self.sizes):
            try:
                self.graphs[size] = self._capture(size)
            except RuntimeError as e:
                raise RuntimeError(
                    f"capturing decode steps of {size} sequences in a CUDA graph failed ({e}); "
                    "enforce_eager=True (--enforce-eager) runs without CUDA graphs"
                ) from e
        logger.info(
            "CUDA graphs: captured decode steps of %d batch sizes (%s) in %.1f s",
            len(self.sizes),
            ", ".join(map(str, self.sizes)),
            time.perf_counter() - start,
        )

    def _capture(self, size: int) -> tuple[Graph, torch.Tensor]:
        self.inputs.pad(0, size)
        self.inputs.copy(size)
        input_ids = self.inputs.device["input_ids"][:size]
        positions = self.inputs.device["positions"][:size]

        def forward() -> torch.Tensor:
            return self.model(input_ids, positions)

        with set_forward_context(self.inputs.metadata(size, self.max_model_len)):
            # Eagerly first: what a forward sets up on its first call (RoPE's table, sized
            # here for max_model_len; cuBLAS's workspace) must not happen in the capture.
            forward()
            return self.capture(forward)

    def size_for(self, attn_metadata: AttentionMetadata) -> int | None:
        """The captured size that runs this step, or None (it runs eagerly)."""
        md = attn_metadata
        if md.num_seqs > self.sizes[-1] or md.max_query_len != 1:
            return None
        if md.block_tables.shape[1] > self.inputs.host["block_tables"].shape[1]:
            return None
        return self.sizes[bisect.bisect_left(self.sizes, md.num_seqs)]

    @property
    def max_decode_rows(self) -> int:
        """The most decode rows a step can have to be replayed."""
        return self.sizes[-1]

    def run(
        self,
        batch: BatchInputs,
        placeholders: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor | None:
        """batch: the step on the host (host_batch); placeholders: input ids written on
        the device after it is copied there (write_placeholders). A step with LoRA adapter
        rows runs eagerly: the graphs were captured without adapters."""
        size = self.size_for(batch.attn_metadata)
        if size is None or current_lora_mapping() is not None:
            return None
        self.inputs.load(batch, size)
        write_placeholders(self.inputs.device["input_ids"], placeholders)
        graph, output = self.graphs[size]
        graph.replay()
        return output[: batch.attn_metadata.num_seqs]
