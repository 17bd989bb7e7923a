"""Runs one scheduled step: flat batch -> model -> logits -> sampler.

`launch` runs a step without waiting for the device and returns what waits for its
output; the step's sampled ids stay on the device (`last_sampled`), where the next step
reads the tokens its placeholders stand for (async scheduling, core/scheduler.py). Under
tensor parallelism the sampling rank broadcasts them to its peers, which `follow` it.
"""

import itertools
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field

import torch

from pagedllm.batch_invariant import set_batch_invariant
from pagedllm.config import EngineConfig
from pagedllm.device_copy import to_device
from pagedllm.distributed.communication import tensor_model_parallel_broadcast
from pagedllm.distributed.parallel_state import set_expert_parallel
from pagedllm.executor import cuda_graph
from pagedllm.executor.batch import (
    BatchInputs,
    SeqChunk,
    as_decode_rows,
    host_batch,
    prepare_batch,
    write_placeholders,
)
from pagedllm.executor.cpu_graph import CpuGraphRunner
from pagedllm.executor.cpu_malloc import keep_freed_memory
from pagedllm.executor.cuda_graph import CudaGraphRunner
from pagedllm.executor.gpu_memory import (
    MemorySnapshot,
    check_free_memory,
    profile_kv_cache_budget,
)
from pagedllm.executor.host_block_tables import HostBlockTables
from pagedllm.executor.kv_cache import (
    attention_layers,
    bind_kv_cache,
    kv_cache_bytes_per_token,
    profiles_gpu_memory,
)
from pagedllm.executor.profile_step import profile_chunks, profile_rows
from pagedllm.forward_context import set_forward_context
from pagedllm.layers.attention_backends.selector import use_attn_backend
from pagedllm.layers.pooler import pool_chunk
from pagedllm.logger import init_logger
from pagedllm.lora.model_manager import LoRAModelManager
from pagedllm.lora.registry import Weights
from pagedllm.model_loader.loader import get_model
from pagedllm.models.pipeline import IntermediateTensors
from pagedllm.sample.metadata import SamplingMetadata, SamplingRow
from pagedllm.sample.sampler import Sampler, SamplerOutput

logger = init_logger(__name__)


@dataclass
class StepInput:
    """What a rank needs to run one step (picklable: sent to tensor-parallel workers).

    sample_indices: for each sampler row, the batch index of the sequence whose last new
    token it samples from (a sequence forking n samples appears n times).
    prompt_logprob_indices: batch indices whose logits at every new token are returned.
    pool_indices: batch indices of pooled prompts (a pooling model's steps hold only
    these): their chunk's partial pooling is returned (layers/pooler.py).
    finished_req_ids: requests that ended since the last step: a sampling rank that keeps
    their rows' state drops it (executor/row_deltas.py).
    placeholder_rows: (batch index, row) of chunks whose last token is a placeholder for
    the token the previous step sampled in that row (async scheduling): the runner writes
    it into the input ids on the device, where that step's sampled ids still are.
    sample_offsets: for each sampler row, how many tokens before its chunk's last one it
    samples at (a draft's verification, speculative decoding); empty when all are 0.
    lora_slots: the content key each LoRA slot the chunks use (`SeqChunk.lora_slot`) must
    hold; lora_loads: the weights of the slots to load first (lora/slot_planner.py).
    """

    chunks: list[SeqChunk]
    blocks_to_copy: list[tuple[int, int]]
    sample_indices: list[int]
    prompt_logprob_indices: list[int]
    pool_indices: list[int] = field(default_factory=list)
    finished_req_ids: set[str] = field(default_factory=set)
    placeholder_rows: list[tuple[int, int]] = field(default_factory=list)
    sample_offsets: list[int] = field(default_factory=list)
    lora_slots: dict[int, str] = field(default_factory=dict)
    lora_loads: dict[int, Weights] = field(default_factory=dict)


@dataclass
class ForwardOutput:
    """A launched forward: the logits of the rows that sample (None for a step that
    samples nothing) and the prompt logits; a pooling model's pooling instead."""

    logits: torch.Tensor | None
    prompt_logits: dict[int, torch.Tensor]
    pooled: dict[int, torch.Tensor] = field(default_factory=dict)


@dataclass
class StepOutput:
    sampler_output: SamplerOutput | None
    prompt_logits: dict[int, torch.Tensor]  # batch index -> [new tokens, V] float32
    pooled: dict[int, torch.Tensor] = field(default_factory=dict)  # batch index -> partial


class ModelRunner:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.device = torch.device(config.device)
        if self.device.type == "cpu":
            keep_freed_memory()
        self.block_size = config.cache_config.block_size
        self.host_block_tables = HostBlockTables()
        self.kv_cache_dtype = config.cache_config.kv_dtype(config.model_config.dtype)
        set_batch_invariant(config.batch_invariant)
        # Where gpu_memory_utilization sizes the KV cache: the GPU's memory before and after
        # the load (gpu_memory.py), that share free at the start.
        self.memory_at_start = self.memory_loaded = None
        if profiles_gpu_memory(config):
            self.memory_at_start = MemorySnapshot.take(self.device, release=True)
            check_free_memory(self.memory_at_start, config.cache_config.gpu_memory_utilization)
        with (
            set_expert_parallel(config.parallel_config.enable_expert_parallel),
            use_attn_backend(config.attention_backend, self.kv_cache_dtype),
        ):
            self.model = get_model(config.model_config, self.device)
        self.lora_manager = None
        if config.lora_config is not None:
            dtype = config.model_config.dtype
            self.lora_manager = LoRAModelManager(self.model, config.lora_config, dtype, self.device)
        if self.memory_at_start is not None:
            self.memory_loaded = MemorySnapshot.take(self.device)
        self.vocab_size = config.model_config.vocab_size
        pooler_config = config.model_config.pooler_config
        self.pooling_type = pooler_config.pooling_type if pooler_config is not None else None
        self.sampler = Sampler(
            self.vocab_size,
            self.device,
            logprobs_mode=config.logprobs_mode,
            logits_processors=config.logits_processors,
        )
        self.kv_cache: torch.Tensor | None = None
        self.graph_runner: CpuGraphRunner | CudaGraphRunner | None = None
        self.last_sampled: torch.Tensor | None = None  # the last step's sampled ids [B]
        # The last step's, whose parameter tensors the next reuses when its rows are alike.
        self._metadata: SamplingMetadata | None = None
        self.shares_samples = (
            config.scheduler_config.async_scheduling
            and config.parallel_config.tensor_parallel_size > 1
        )

    @property
    def kv_cache_bytes_per_token(self) -> int:
        return kv_cache_bytes_per_token(self.model, self.kv_cache_dtype)

    def available_kv_cache_bytes(self, sample: bool = True) -> int:
        """On a GPU: the bytes gpu_memory_utilization leaves the KV cache, measured by a
        profile run (gpu_memory.py). `sample`: this rank samples (a tensor-parallel peer
        follows)."""
        assert self.memory_at_start is not None and self.memory_loaded is not None
        budget = profile_kv_cache_budget(
            self.device,
            self.memory_at_start,
            self.memory_loaded,
            self.config.cache_config.gpu_memory_utilization,
            lambda: self.profile_run(sample),
        )
        logger.info("GPU memory: %s", budget.describe())
        return budget.kv_cache

    @torch.inference_mode()
    def profile_run(self, sample: bool = True) -> int:
        """The largest step the scheduler can make (profile_step.py), on a KV cache of its
        own that is dropped after; -> that cache's bytes."""
        config = self.config
        chunks, blocks = profile_chunks(
            config.scheduler_config.max_num_batched_tokens,
            config.scheduler_config.max_num_seqs,
            config.model_config.max_model_len,
            self.block_size,
        )
        indices = list(range(len(chunks)))
        self.kv_cache = bind_kv_cache(
            self.model, blocks, self.block_size, self.kv_cache_dtype, self.device
        )
        try:
            cache_bytes = self.kv_cache.numel() * self.kv_cache.element_size()
            if self.pooling_type is not None:
                self.pool(StepInput(chunks, [], [], [], pool_indices=indices))
            elif sample:
                rows = profile_rows(chunks, config.max_logprobs, self.vocab_size)
                self.execute(StepInput(chunks, [], indices, []), rows)
            else:
                self.follow(StepInput(chunks, [], indices, []))
        finally:
            for layer in attention_layers(self.model):
                layer.kv_cache = None
            self.kv_cache, self.last_sampled, self._metadata = None, None, None
        return cache_bytes

    def init_kv_cache(self, num_blocks: int) -> None:
        """Allocates the cache of num_blocks blocks (plus, with CUDA graphs, their padding
        rows' block, which the scheduler never hands out), then captures the graphs."""
        config = self.config
        no_cuda_graphs = cuda_graph.unsupported_reason(
            self.model, self.device, config.enforce_eager
        )
        if no_cuda_graphs is None and config.parallel_config.pipeline_parallel_size > 1:
            no_cuda_graphs = "pipeline parallelism (a stage runs on the stage before's output)"
        cache_blocks = num_blocks + (no_cuda_graphs is None)
        self.kv_cache = bind_kv_cache(
            self.model, cache_blocks, self.block_size, self.kv_cache_dtype, self.device
        )
        max_model_len = config.model_config.max_model_len
        # Captured CPU steps replay pagedllm._C's launches; the Triton interpreter's are not.
        if config.attention_backend != "TRITON_ATTN" and CpuGraphRunner.applies(
            self.device, config.parallel_config.world_size, config.enforce_eager
        ):
            max_blocks = -(-max_model_len // self.block_size)
            lora_slots = 0 if self.lora_manager is None else self.lora_manager.num_slots
            self.graph_runner = CpuGraphRunner(self.model, max_blocks, [self.kv_cache], lora_slots)
        elif no_cuda_graphs is None:
            sizes = cuda_graph.capture_sizes(config.scheduler_config.max_num_seqs)
            self.graph_runner = CudaGraphRunner(
                self.model, sizes, max_model_len, self.block_size, num_blocks, self.device
            )
            self.graph_runner.capture_all()
        elif self.device.type == "cuda":
            logger.info("CUDA graphs off: %s", no_cuda_graphs)

    def _copy_blocks(self, blocks_to_copy: list[tuple[int, int]]) -> None:
        if not blocks_to_copy:
            return
        src, dst = (to_device(ids, torch.int64, self.device) for ids in zip(*blocks_to_copy))
        self.kv_cache[:, :, dst] = self.kv_cache[:, :, src]

    @torch.inference_mode()
    def forward_stage(
        self, step: StepInput, intermediate: IntermediateTensors | None
    ) -> IntermediateTensors:
        """A pipeline stage before the last: its layers' output for the next stage."""
        self._copy_blocks(step.blocks_to_copy)
        batch = prepare_batch(step.chunks, self.block_size, self.device)
        with set_forward_context(batch.attn_metadata), self._lora(step):
            return self.model(batch.input_ids, batch.positions, intermediate)

    @torch.inference_mode()
    def forward(
        self, step: StepInput, intermediate: IntermediateTensors | None = None
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """-> (logits [len(sample_indices), V], prompt logits by batch index). `intermediate`:
        the previous pipeline stage's output, on the last stage of several."""
        hidden, starts = self._hidden_states(step, intermediate)
        sampled = self._sampled_rows(hidden, starts, step.sample_indices, step.sample_offsets)
        logits = self.model.compute_logits(sampled)
        prompt_logits = {}
        for i in step.prompt_logprob_indices:
            rows = hidden[starts[i] : starts[i + 1]]
            prompt_logits[i] = self.model.compute_logits(rows).float()
        return logits, prompt_logits

    @torch.inference_mode()
    def pool(
        self, step: StepInput, intermediate: IntermediateTensors | None = None
    ) -> dict[int, torch.Tensor]:
        """A pooling model's step: each pooled chunk's float32 partial by batch index
        (none for a CLS chunk past position 0)."""
        assert self.pooling_type is not None, "pool() runs a pooling model's steps"
        hidden, starts = self._hidden_states(step, intermediate)
        pooled = {}
        for i in step.pool_indices:
            partial = pool_chunk(
                hidden[starts[i] : starts[i + 1]], step.chunks[i].start, self.pooling_type
            )
            if partial is not None:
                pooled[i] = partial
        return pooled

    def _hidden_states(
        self, step: StepInput, intermediate: IntermediateTensors | None
    ) -> tuple[torch.Tensor, list[int]]:
        """The final hidden states [T, hidden] of the step's tokens, and each chunk's start
        row in them (plus the end)."""
        self._copy_blocks(step.blocks_to_copy)
        pin = self.device.type != "cpu"
        batch = host_batch(step.chunks, self.block_size, pin, self.host_block_tables)
        starts = [0, *itertools.accumulate(batch.attn_metadata.query_lens_cpu)]
        runner = self.graph_runner
        if runner is not None and step.sample_offsets and starts[-1] <= runner.max_decode_rows:
            # Verifying drafts: as decode rows, the graph runner replays the step.
            batch = as_decode_rows(batch, pin)
        placeholders = self._placeholder_tokens(step.placeholder_rows, starts)
        with self._lora(step):
            return self._run_model(batch, intermediate, placeholders), starts

    def _lora(self, step: StepInput) -> AbstractContextManager:
        """The step's LoRA adapters applied to their chunks' rows (nothing without any)."""
        if self.lora_manager is None or not step.lora_slots:
            return nullcontext()
        slots = [chunk.lora_slot for chunk in step.chunks]
        lengths = [len(chunk.token_ids) for chunk in step.chunks]
        return self.lora_manager.activate(step.lora_slots, step.lora_loads, slots, lengths)

    def _placeholder_tokens(
        self, placeholder_rows: list[tuple[int, int]], starts: list[int]
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(where in the input ids, the last step's sampled ids to put there), on the
        device, for the chunks whose last token is a placeholder; None when none is."""
        if not placeholder_rows:
            return None
        assert self.last_sampled is not None, "placeholders read the last step's samples"
        where = to_device(
            [starts[i + 1] - 1 for i, _ in placeholder_rows], torch.int64, self.device
        )
        rows = to_device([row for _, row in placeholder_rows], torch.int64, self.device)
        return where, self.last_sampled[rows]

    def _pending_tokens(self, step: StepInput) -> tuple[torch.Tensor, torch.Tensor]:
        """(sampler rows, their tokens on the device) of the rows whose sequence's last
        output token is a placeholder: the last step's, not yet in their output lists."""
        prev_row = dict(step.placeholder_rows)  # batch index -> row in the last step
        rows = [r for r, i in enumerate(step.sample_indices) if i in prev_row]
        prev = [prev_row[step.sample_indices[r]] for r in rows]
        tokens = self.last_sampled[to_device(prev, torch.int64, self.device)]
        return to_device(rows, torch.int64, self.device), tokens

    def _sampled_rows(
        self,
        hidden: torch.Tensor,
        starts: list[int],
        sample_indices: list[int],
        sample_offsets: list[int],
    ) -> torch.Tensor:
        """The hidden row each sampler row samples at: its sequence's last new token, or
        `sample_offsets` tokens before it; all of hidden, as it is, when every sequence
        decodes one token and is sampled (a decode step)."""
        if hidden.shape[0] == len(starts) - 1 and sample_indices == list(range(len(hidden))):
            return hidden
        rows = [starts[i + 1] - 1 for i in sample_indices]
        if sample_offsets:
            rows = [row - offset for row, offset in zip(rows, sample_offsets, strict=True)]
        return hidden[to_device(rows, torch.int64, self.device)]

    def _run_model(
        self,
        batch: BatchInputs,
        intermediate: IntermediateTensors | None,
        placeholders: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Hidden states [T, hidden] of the batch built on the host: replayed when the graph
        runner can, else eager on the batch copied to the device (`placeholders`: input ids
        written on the device, see _placeholder_tokens)."""
        if self.graph_runner is not None:
            hidden = self.graph_runner.run(batch, placeholders)
            if hidden is not None:
                return hidden
        batch = batch.to(self.device)
        write_placeholders(batch.input_ids, placeholders)
        with set_forward_context(batch.attn_metadata):
            return self.model(batch.input_ids, batch.positions, intermediate)

    @torch.inference_mode()
    def follow(self, step: StepInput, intermediate: IntermediateTensors | None = None) -> None:
        """A tensor-parallel peer of the sampling rank: the same forward (its collectives
        need every rank), nothing sampled; under async scheduling it receives the sampled
        ids, for the next step's placeholders."""
        if step.pool_indices:
            self.pool(step, intermediate)
            return
        self.forward(step, intermediate)
        self.last_sampled = None
        if self.shares_samples and step.sample_indices:
            sampled = torch.empty(len(step.sample_indices), dtype=torch.int64, device=self.device)
            self.last_sampled = tensor_model_parallel_broadcast(sampled)

    def execute(
        self,
        step: StepInput,
        rows: list[SamplingRow],
        intermediate: IntermediateTensors | None = None,
    ) -> StepOutput:
        """Run and sample the step (on the last pipeline stage: from `intermediate`)."""
        return self.launch(step, rows, intermediate)()

    def launch(
        self,
        step: StepInput,
        rows: list[SamplingRow],
        intermediate: IntermediateTensors | None = None,
    ) -> Callable[[], StepOutput]:
        """`execute` up to the wait for the device: -> what waits and gives its output."""
        return self.launch_sampling(step, self.launch_forward(step, intermediate), rows)

    @torch.inference_mode()
    def launch_forward(
        self, step: StepInput, intermediate: IntermediateTensors | None = None
    ) -> ForwardOutput:
        """The step's forward, launched: its logits (and a pooling model's pooling)."""
        if not step.chunks:
            return ForwardOutput(None, {})
        if step.pool_indices:
            return ForwardOutput(None, {}, self.pool(step, intermediate))
        return ForwardOutput(*self.forward(step, intermediate))

    @torch.inference_mode()
    def launch_sampling(
        self,
        step: StepInput,
        forward: ForwardOutput,
        rows: list[SamplingRow],
        rows_lack_placeholders: bool = True,
    ) -> Callable[[], StepOutput]:
        """Sample the launched forward's logits: -> what waits and gives the step's output.
        `rows_lack_placeholders`: the rows' output lists lack the tokens the step's
        placeholders stand for (rows built when the step was scheduled, async scheduling):
        the penalties count them on the device."""
        if forward.logits is None or not rows:
            self.last_sampled = None
            output = StepOutput(None, forward.prompt_logits, forward.pooled)
            return lambda: output
        metadata = SamplingMetadata.build(rows, self.vocab_size, self.device, self._metadata)
        self._metadata = metadata
        if rows_lack_placeholders and step.placeholder_rows and not metadata.no_penalties:
            metadata.pending_tokens = self._pending_tokens(step)
        pending = self.sampler.launch(forward.logits, metadata)
        self.last_sampled = pending.sampled_on_device
        if self.shares_samples:
            tensor_model_parallel_broadcast(self.last_sampled)
        return lambda: StepOutput(pending.result(), forward.prompt_logits)
