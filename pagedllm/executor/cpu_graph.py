"""Captured decode steps on CPU: a decode batch's kernel launches recorded once, replayed.

A decode step of a small model is mostly Python: the default model's batch-1 step runs ~300
kernels, and the layer calls, argument checks and allocations between them cost as much as
the kernels (replayed, a bf16 step takes about half the time of an eager one; `pagedllm
bench latency --batch-size 1` re-measures it).
Like vLLM's CUDA graphs, the decoder's forward is captured once per batch size in
CAPTURE_SIZES and replayed: the model's own forward runs on static input buffers under
`record_launches()`, and later steps copy their inputs into those buffers and rerun the
recorded launches (`replay_launches`), which point at the same memory.

Only kernel launches are replayed, so capture lets torch do nothing but allocate and take
views (`_CaptureMode`): any torch op that computes (a torch fallback, a collective, a copy)
would be skipped on replay, so it makes that batch size run eagerly instead, logged once.
The buffers capture allocated are then packed by lifetime into one small arena
(launch_memory.py: 6.1 -> 0.11 MB for 8 sequences of the default model), the launches moved
to it, and the moved launches replayed once against the eager result, bit for bit, before
the size is used. Everything the launches point into stays alive here: the arena, the
static inputs, and the model's parameters, buffers and KV cache as they were at capture.

B decodes replay the smallest captured size >= B; the rows past B are padding: position 0,
cache slot -1 (not written), a one-token sequence reading block 0. A step with LoRA adapter
rows replays a capture of its size made with the slots its rows use, each applied to the
rows a static buffer maps to it (lora/layers.py; padding rows map to none), so the same
launches serve any rows of those adapters and base rows. Each size keeps up to
LORA_CAPTURES_PER_SIZE such sets of slots; other sets replay the capture of every slot.
A replayed step equals the eager step of its padded size exactly
(tests/executor/test_cpu_graph.py), and, since the kernels compute every row independently
of the others (float32, bf16 and GGUF alike), the unpadded one too.
"""

import gc
import logging
import sys
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pagedllm import _cpu_kernels
from pagedllm.executor import launch_memory
from pagedllm.executor.batch import BatchInputs, write_placeholders
from pagedllm.forward_context import AttentionMetadata, set_forward_context
from pagedllm.lora.layers import LoRAMapping, current_lora_mapping, set_lora_mapping

logger = logging.getLogger(__name__)

LORA_CAPTURES_PER_SIZE = 4
"""Captures of one size for steps with LoRA rows, each for one set of slots: a step pays
for the slots it uses only (a slot's two thin matmuls on every targeted layer, `pagedllm
bench lora` measures them), and a model with many slots does not keep a capture for every
set of them."""

CAPTURE_SIZES = (1, 2, 4, 8, 16)
"""Decode batch sizes that are captured (as vLLM pads to its cudagraph sizes); larger
decode batches, and every step with a prefill, run eagerly."""

_ALLOCATIONS = frozenset(
    getattr(torch.ops.aten, name)
    for name in ("empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided")
)


class CaptureUnsupported(Exception):
    """A torch op that computes ran during capture: replaying launches would skip it."""


class _CaptureMode(TorchDispatchMode):
    """Lets allocations and views through, keeping what they return alive (so that every
    allocation gets memory of its own, which launch_memory then packs); raises
    CaptureUnsupported for any other op (including in-place ones, which return an input)."""

    def __init__(self) -> None:
        super().__init__()
        self.tensors: list[object] = []
        self.allocations: list[torch.Tensor] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        if func._schema.is_mutable and func.overloadpacket not in _ALLOCATIONS:
            # Refused before it runs: the capture's padding rows are not valid input for
            # every op (torch's cache write would index slot -1, which the kernels skip).
            raise CaptureUnsupported(f"{func} computes in torch")
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket in _ALLOCATIONS:
            self.allocations.append(out)
        elif not _is_view(func, args, out):
            raise CaptureUnsupported(f"{func} computes in torch")
        self.tensors.append(out)
        return out


def _is_view(func: torch._ops.OpOverload, args: tuple, out: object) -> bool:
    """func mutates nothing and every tensor it returns shares an input tensor's memory."""
    if func._schema.is_mutable:
        return False
    inputs = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
    outs = out if isinstance(out, (tuple, list)) else (out,)
    tensors = [t for t in outs if isinstance(t, torch.Tensor)]
    return bool(tensors) and all(t.untyped_storage().data_ptr() in inputs for t in tensors)


@dataclass
class _DecodeGraph:
    """One captured batch size: its static inputs, its output and its launches."""

    size: int
    inputs_embeds: torch.Tensor  # [size, hidden]
    positions: torch.Tensor  # [size] int64
    slot_mapping: torch.Tensor  # [size] int64
    seq_lens: torch.Tensor  # [size] int32
    block_tables: torch.Tensor  # [size, max_blocks] int32
    lora_rows: torch.Tensor | None = None  # [size] int32: each row's LoRA slot, -1 none
    output: torch.Tensor | None = None
    launches: list[_cpu_kernels.Launch] = field(default_factory=list)
    kept: list[object] = field(default_factory=list)

    def fill(self, batch: BatchInputs, inputs_embeds: torch.Tensor) -> None:
        """Copies batch's B decodes into rows [0, B) and pads rows [B, size)."""
        md, b = batch.attn_metadata, batch.attn_metadata.num_seqs
        self.inputs_embeds[:b].copy_(inputs_embeds)
        self.positions[:b].copy_(batch.positions)
        self.positions[b:] = 0
        self.slot_mapping[:b].copy_(md.slot_mapping)
        self.slot_mapping[b:] = -1
        self.seq_lens[:b].copy_(md.seq_lens)
        self.seq_lens[b:] = 1
        self.block_tables[:b, : md.block_tables.shape[1]].copy_(md.block_tables)
        self.block_tables[b:] = 0
        if self.lora_rows is not None:
            mapping = current_lora_mapping()
            assert mapping is not None, "a LoRA capture replays steps with adapter rows"
            self.lora_rows[:b].copy_(mapping.row_slots)
            self.lora_rows[b:] = -1

    def metadata(self, seq_lens: list[int]) -> AttentionMetadata:
        """The forward context of the capture: every row a decode."""
        pad = [1] * (self.size - len(seq_lens))
        return AttentionMetadata(
            slot_mapping=self.slot_mapping,
            query_start_loc=torch.arange(self.size + 1, dtype=torch.int32),
            seq_lens=self.seq_lens,
            block_tables=self.block_tables,
            query_lens_cpu=[1] * self.size,
            seq_lens_cpu=[*seq_lens, *pad],
        )


class CpuGraphRunner:
    """Runs pure-decode steps of up to CAPTURE_SIZES[-1] sequences by replay.

    `run` returns the hidden states [B, hidden], or None when the step must run eagerly (a
    prefill in it, too many sequences, a size that could not be captured)."""

    def __init__(
        self, model: torch.nn.Module, max_blocks: int, kept: list[object], lora_slots: int = 0
    ) -> None:
        """max_blocks: the longest block table a sequence can have; kept: tensors the
        launches may point into besides the model's (the KV cache); lora_slots: the
        model's LoRA slots (max_loras), 0 without LoRA."""
        self.model = model
        self.max_blocks = max_blocks
        self.kept = kept
        self.lora_slots = lora_slots
        # by (size, the LoRA slots applied: () without LoRA rows); None: those steps run
        # eagerly
        self.graphs: dict[tuple[int, tuple[int, ...]], _DecodeGraph | None] = {}

    @staticmethod
    def applies(device: torch.device, world_size: int, enforce_eager: bool) -> bool:
        """One rank only (world_size: tensor x pipeline parallel ranks)."""
        return (
            device.type == "cpu"
            and _cpu_kernels.available()
            and world_size == 1
            and not enforce_eager
        )

    @property
    def max_decode_rows(self) -> int:
        """The most decode rows a step can have to be replayed."""
        return CAPTURE_SIZES[-1]

    def run(
        self,
        batch: BatchInputs,
        placeholders: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor | None:
        """placeholders: input ids written into the batch first (write_placeholders)."""
        write_placeholders(batch.input_ids, placeholders)
        md = batch.attn_metadata
        b = md.num_seqs
        if (
            b > CAPTURE_SIZES[-1]
            or md.max_query_len != 1
            or md.block_tables.shape[1] > self.max_blocks
        ):
            return None
        size = next(s for s in CAPTURE_SIZES if s >= b)
        key = (size, self._lora_slots_key(size))
        if key in self.graphs and self.graphs[key] is None:
            return None
        inputs_embeds = self.model.get_input_embeddings(batch.input_ids)
        graph = self.graphs.get(key)
        if graph is None:
            hidden = self._capture(key, batch, inputs_embeds)
            return None if hidden is None else hidden[:b]
        graph.fill(batch, inputs_embeds)
        try:
            _cpu_kernels.replay_launches(graph.launches)
        except ValueError:
            # An index check failed: a position past the rotary table captured, say. The
            # eager forward rebuilds what it must, or raises; capture again after it.
            self.graphs.clear()
            return None
        return graph.output[:b]

    def _lora_slots_key(self, size: int) -> tuple[int, ...]:
        """The slots the step's capture applies: none without LoRA rows; the slots its rows
        use, or every slot once the size holds LORA_CAPTURES_PER_SIZE other sets."""
        mapping = current_lora_mapping()
        if mapping is None:
            return ()
        captured = {slots for s, slots in self.graphs if s == size and slots}
        if mapping.slots in captured or len(captured) < LORA_CAPTURES_PER_SIZE:
            return mapping.slots
        return tuple(range(self.lora_slots))

    def _capture(
        self, key: tuple[int, tuple[int, ...]], batch: BatchInputs, inputs_embeds: torch.Tensor
    ) -> torch.Tensor | None:
        """Runs the step eagerly while recording it; -> its hidden states [size, hidden], or
        None when it computed in torch (the caller then runs it eagerly).

        A process's first capture makes torch import torch._dynamo (the dispatch mode goes
        through its disable wrapper), and that import leaves a frame in a reference cycle
        whose callers' frames hold this runner and the model; collected here, a dropped LLM
        is freed at once (docs/python-api.md), not at the cyclic collector's next run."""
        dynamo_was_loaded = "torch._dynamo" in sys.modules
        try:
            return self._record(key, batch, inputs_embeds)
        finally:
            if not dynamo_was_loaded and "torch._dynamo" in sys.modules:
                gc.collect()

    def _record(
        self, key: tuple[int, tuple[int, ...]], batch: BatchInputs, inputs_embeds: torch.Tensor
    ) -> torch.Tensor | None:
        size, slots = key
        hidden = inputs_embeds.shape[1]
        graph = _DecodeGraph(
            size,
            inputs_embeds.new_empty(size, hidden),
            torch.empty(size, dtype=torch.int64),
            torch.empty(size, dtype=torch.int64),
            torch.empty(size, dtype=torch.int32),
            torch.zeros(size, self.max_blocks, dtype=torch.int32),
            torch.empty(size, dtype=torch.int32) if slots else None,
        )
        graph.fill(batch, inputs_embeds)
        what = f"{size} sequences" + (f" with LoRA slots {list(slots)}" if slots else "")
        mode = _CaptureMode()
        lora = LoRAMapping(graph.lora_rows, slots) if slots else None
        try:
            with (
                set_forward_context(graph.metadata(batch.attn_metadata.seq_lens_cpu)),
                set_lora_mapping(lora),
                _cpu_kernels.record_launches() as launches,
                mode,
            ):
                eager = self.model(None, graph.positions, inputs_embeds=graph.inputs_embeds)
        except CaptureUnsupported as e:
            # str(e): a log record holding e would hold its traceback's frames, the whole
            # engine among them, for as long as a handler keeps records
            logger.info("Decode steps of %s run eagerly: %s", what, str(e))
            self.graphs[key] = None
            return None
        graph.launches, arena, graph.output = launch_memory.plan(launches, mode.allocations, eager)
        _cpu_kernels.replay_launches(graph.launches)  # rewrites this step's cache rows as they are
        if not _same_bits(graph.output, eager):
            logger.warning("Decode steps of %s run eagerly: replay differed", what)
            self.graphs[key] = None
            return eager
        graph.kept = [arena, *self.model.parameters(), *self.model.buffers(), *self.kept]
        self.graphs[key] = graph
        logger.info(
            "Captured decode steps of %s: %d kernel launches, %.2f MB of buffers "
            "(%.1f MB before packing)",
            what,
            len(launches),
            arena.numel() / 1e6,
            sum(launch_memory.storages(mode.allocations).values()) / 1e6,
        )
        return eager


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)
    )
