"""LLMEngine: add_request / step / abort_request, composed of vLLM v1's parts.

add_request: InputProcessor (validate, tokenize) -> Request -> Scheduler's waiting queue
             (a request with structured outputs waits in WaitingForGrammar until compiled)
step:        Scheduler.schedule -> plan_step -> Executor.execute_async (model runner, sampler)
             -> OutputProcessor (tokens, text, logprobs, stops) -> RequestOutputs
             (-> Drafter: the next step's draft tokens, under speculative decoding)
Under pipeline parallelism a step submits a batch and returns without its results while
fewer than one batch per stage is in flight (vLLM v1's batch queue), so every stage has a
micro-batch; otherwise it waits for the oldest batch and processes its results. Async
scheduling keeps two batches the same way on one rank: the next step is scheduled and
launched while the last runs, and its sequences read their last token on the device;
when a sequence's sampling needs that token on the host, the step's forward is launched
first and its sampling after the last step is processed.
A pooling model (runner "pooling") takes PoolingParams instead: its requests run their
prompt's prefill through the same scheduler and end as PoolingRequestOutputs.
"""

import gc
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from pagedllm.config import EngineConfig
from pagedllm.core.block_manager import BlockManager
from pagedllm.core.scheduler import Scheduler, SchedulerOutput
from pagedllm.core.sequence import Sequence
from pagedllm.engine.arg_utils import EngineArgs
from pagedllm.engine.drafter import Drafter
from pagedllm.engine.grammar_wait import WaitingForGrammar
from pagedllm.engine.input_processor import InputProcessor, PromptType
from pagedllm.engine.output_processor import OutputProcessor
from pagedllm.engine.pooling_request import PoolingRequest
from pagedllm.engine.request import Request
from pagedllm.engine.stats import (
    ITERATION_TOKENS_BUCKETS,
    EngineStats,
    HistogramCounts,
    LoRAStats,
)
from pagedllm.engine.step_plan import StepPlan, plan_step, sampled_rows, sampling_rows
from pagedllm.engine.tokenizer import (
    eos_token_ids,
    generation_config_dict,
    get_tokenizer,
    model_eos_token_id,
)
from pagedllm.executor.executor import StepFuture
from pagedllm.executor.factory import make_executor
from pagedllm.executor.headless import run_headless
from pagedllm.executor.kv_cache import num_kv_blocks, profiles_gpu_memory
from pagedllm.executor.torchrun_executor import run_torchrun_worker, torchrun_rank
from pagedllm.layers.st_projector import load_st_projector
from pagedllm.logger import init_logger
from pagedllm.lora.registry import make_lora_registry
from pagedllm.lora.request import LoRARequest
from pagedllm.lora.slot_planner import LoRASlotPlanner
from pagedllm.model_loader.seq_cls_model import load_seq_cls_head
from pagedllm.models.registry import ModelRegistry
from pagedllm.outputs import PoolingRequestOutput, RequestOutput
from pagedllm.pooling_params import PoolingParams
from pagedllm.sampling_params import SamplingParams
from pagedllm.structured_output import StructuredOutputManager

__all__ = ["LLMEngine", "PromptType"]

logger = init_logger(__name__)

# How long a step with nothing to run waits for a grammar to finish compiling.
GRAMMAR_WAIT_S = 0.05


@dataclass
class _Batch:
    """A submitted step whose results have not been processed yet."""

    out: SchedulerOutput
    plan: StepPlan
    future: StepFuture
    # Async scheduling: it samples for a sequence whose next sampling needs that token on
    # the host, so the next step's sampling waits until it is processed (its forward not).
    samples_from_host: bool = False


@contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """Start-up makes hundreds of thousands of long-lived objects (modules, tokenizer, KV
    blocks), and their allocation triggers full collections that walk them all: 0.2-0.3 s
    of a ~1 s start-up on the default model. The cyclic collector waits until the engine is
    built; cycles made meanwhile are collected at its next pass, as usual."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.model_config = config.model_config
        torch.manual_seed(config.seed)
        # An architecture no model class runs fails here, before the tokenizer and the
        # weights are loaded, so the error names the architecture and not what failed first.
        ModelRegistry.resolve_model_cls(self.model_config.architecture)
        self.tokenizer = None if config.skip_tokenizer_init else get_tokenizer(self.model_config)
        eos_token_id = model_eos_token_id(self.model_config, self.tokenizer)
        self.executor = make_executor(config)
        available = None
        if profiles_gpu_memory(config):
            available = self.executor.available_kv_cache_bytes()
        self.num_blocks = num_kv_blocks(config, self.executor.kv_cache_bytes_per_token, available)
        self.executor.init_kv_cache(self.num_blocks)
        cache, sched = config.cache_config, config.scheduler_config
        self.block_manager = BlockManager(
            self.num_blocks, cache.block_size, cache.enable_prefix_caching
        )
        lora = config.lora_config
        self.scheduler = Scheduler(
            sched,
            self.block_manager,
            config.parallel_config.pipeline_parallel_size,
            None if lora is None else lora.max_loras,
        )
        self.lora_registry = make_lora_registry(config)
        self.lora_slots = None if lora is None else LoRASlotPlanner(lora.max_loras)
        if sched.async_scheduling:
            logger.info(
                "Async scheduling on: each step is scheduled while the one before runs "
                "(--no-async-scheduling turns it off)"
            )
        generation_config = generation_config_dict(self.model_config)
        self.structured_output = StructuredOutputManager(
            self.tokenizer, eos_token_ids(eos_token_id, generation_config)
        )
        self.input_processor = InputProcessor(
            config,
            self.tokenizer,
            eos_token_id,
            generation_config,
            self.executor.validate_params,
            self.num_blocks,
            self.structured_output,
            self.lora_registry,
        )
        self.output_processor = OutputProcessor(
            self.scheduler,
            self.tokenizer,
            eos_token_id,
            self.model_config.max_model_len,
            self.model_config.pooler_config,
            load_st_projector(self.model_config.pooler_config),
            load_seq_cls_head(self.model_config, self.tokenizer),
        )
        self.drafter = None
        if config.speculative_config is not None:
            self.drafter = Drafter(config.speculative_config, self.model_config.max_model_len)
        self.waiting_for_grammar = WaitingForGrammar()
        self.batch_queue: deque[_Batch] = deque()
        self.iteration_tokens = HistogramCounts.empty(ITERATION_TOKENS_BUCKETS)

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs, node_replicas: int = 1) -> "LLMEngine":
        """The engine; under torchrun, ranks > 0 enter the worker loop instead, and with
        --nnodes, nodes past the first start their ranks instead: both exit the process when
        rank 0 shuts down (see run_torchrun_worker, run_headless). `node_replicas`: the
        data-parallel replicas on this node, this one among them (CacheConfig's)."""
        config = engine_args.create_engine_config()
        config.cache_config.node_replicas = node_replicas
        if torchrun_rank():
            run_torchrun_worker(config)
        if config.parallel_config.node_rank > 0:
            run_headless(config)
        with _cyclic_gc_paused():
            return cls(config)

    @property
    def requests(self) -> dict[str, Request | PoolingRequest]:
        """The requests in flight, by id."""
        return self.output_processor.requests

    def add_request(
        self,
        request_id: str,
        prompt: PromptType,
        params: SamplingParams | PoolingParams | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
        lora_request: LoRARequest | None = None,
    ) -> None:
        """Validate and queue a request; a bad one raises ValueError and changes nothing.
        A pooling model's requests take PoolingParams (None: the defaults). `priority`
        (vLLM's; lower is served first) needs the "priority" scheduling policy unless 0.
        `lora_request`: the LoRA adapter it runs with (needs enable_lora; read and checked
        unless the engine holds its weights, docs/lora.md)."""
        if request_id in self.requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        processor = self.input_processor
        if isinstance(params, PoolingParams) or (
            params is None and self.model_config.runner_type == "pooling"
        ):
            self.lora_registry.check(lora_request)  # refused: pooling models serve none
            pooling = processor.process_pooling(request_id, prompt, params, arrival_time, priority)
            self.requests[request_id] = pooling
            self.scheduler.add_seq(pooling.seq)
            return
        request = processor.process(
            request_id, prompt, params, arrival_time, priority, lora_request
        )
        self.requests[request_id] = request
        if request.compiling_matchers is None:
            self.scheduler.add_seq(request.completions[0].seq)
        else:
            self.waiting_for_grammar.add(request)

    def add_lora(self, lora_request: LoRARequest) -> bool:
        """vLLM's: check an adapter, load its weights into host memory and keep it known
        (ValueError for one the engine cannot run)."""
        return self.lora_registry.add(lora_request)

    def remove_lora(self, lora_int_id: int) -> bool:
        """vLLM's: forget an adapter (requests running with it finish with it)."""
        return self.lora_registry.remove(lora_int_id)

    def list_loras(self) -> set[int]:
        """vLLM's: the ids of the adapters the engine knows."""
        return self.lora_registry.list()

    def abort_request(self, request_id: str | Iterable[str]) -> None:
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        for rid in ids:
            if self.requests.pop(rid, None) is not None:
                self.waiting_for_grammar.discard(rid)
                self.scheduler.abort_seq(rid)

    def abort_after_failed_step(self) -> list[str]:
        """Abort every request in flight after `step` raised; their ids (the caller fails
        them). Whether the engine can go on: `is_healthy`."""
        logger.exception("engine step failed; aborting the requests in flight")
        if self.lora_slots is not None:
            self.lora_slots.reset()  # the ranks may not have made the step's loads
        request_ids = list(self.requests)
        self.abort_request(request_ids)
        return request_ids

    def step(self) -> list[RequestOutput | PoolingRequestOutput]:
        outputs = self._step()
        while self.batch_queue and not self.requests:
            # What is left in flight ran ahead for requests that have ended: its results
            # (and their device memory) are dropped now, not when the next request comes.
            self._finish_oldest_batch()
        return outputs

    def _step(self) -> list[RequestOutput | PoolingRequestOutput]:
        outputs = self._admit_compiled()  # requests whose grammar failed, if any
        if len(self.batch_queue) < self.executor.max_concurrent_batches:
            out = self.scheduler.schedule()
            if not out.is_empty:
                self.iteration_tokens.observe(out.num_batched_tokens)
                future = self._submit(out, outputs)
                if len(self.batch_queue) < self.executor.max_concurrent_batches:
                    if not future.done():
                        return outputs
        if not self.batch_queue:
            return outputs
        return outputs + self._finish_oldest_batch()

    def _submit(self, out: SchedulerOutput, outputs: list) -> StepFuture:
        """Plan and launch the step. Under async scheduling, when the step in flight samples
        for a request whose next sampling needs that token on the host, this step's forward
        is launched, the step in flight is processed (its outputs added to `outputs`), and
        only then are this step's rows built and its sampling launched."""
        in_flight = self.batch_queue[-1] if self.batch_queue else None
        late = in_flight is not None and in_flight.samples_from_host
        args = (self.requests, self.structured_output)
        plan = plan_step(
            out, *args, prev_rows=self._prev_rows(), with_rows=not late, lora_slots=self.lora_slots
        )
        if late:
            forward = self.executor.launch_forward(plan.step_input)
            outputs += self._finish_oldest_batch()
            plan.rows = sampling_rows(out, plan.owners, *args)
            future = self.executor.launch_sampling(plan.step_input, forward, plan.rows)
        else:
            future = self.executor.execute_async(plan.step_input, plan.rows)
        self.batch_queue.append(_Batch(out, plan, future, self._samples_from_host(out)))
        return future

    def _prev_rows(self) -> dict[int, int] | None:
        """The sampler rows of the newest batch in flight, by seq id (async scheduling:
        where the next step's placeholders read their tokens)."""
        if not self.scheduler.async_scheduling or not self.batch_queue:
            return None
        newest = self.batch_queue[-1]
        return sampled_rows(newest.plan, newest.out)

    def _samples_from_host(self, out: SchedulerOutput) -> bool:
        """Async scheduling: whether the step samples for a sequence whose next sampling
        needs that token on the host (_Batch)."""
        if not self.scheduler.async_scheduling:
            return False
        return any(s.produces_token and self._needs_host_token(s.seq) for s in out.scheduled)

    def _needs_host_token(self, seq: Sequence) -> bool:
        """Whether sampling seq's next token needs its last one on the host: custom logits
        processors (user code that may read it), a structured-output grammar or a bad word
        of several tokens (Request.reads_host_tokens), min_tokens still counting it.
        Penalties count it on the device."""
        request = self.requests.get(seq.request_id)
        if not isinstance(request, Request):
            return False
        if self.config.logits_processors or request.reads_host_tokens:
            return True
        return seq.num_output_tokens < request.params.min_tokens

    def _finish_oldest_batch(self) -> list[RequestOutput | PoolingRequestOutput]:
        batch = self.batch_queue.popleft()
        result = batch.future.result()
        self.scheduler.update_after_step(batch.out.scheduled)
        outputs = self.output_processor.process(batch.out, result, batch.plan.owners)
        if self.drafter is not None:
            self.drafter.propose(batch.out, self.requests)
        return outputs

    def _admit_compiled(self) -> list[RequestOutput]:
        """Requests whose grammar has compiled join the scheduler; those whose grammar
        failed to compile end here, with their error (the outputs returned). With nothing
        else to run, wait a little for a compile rather than spin."""
        idle = not self.scheduler.has_unfinished_seqs()
        failed = []
        for request in self.waiting_for_grammar.pop_ready(GRAMMAR_WAIT_S if idle else 0.0):
            if request.error is None:
                self.scheduler.add_seq(request.completions[0].seq)
                continue
            del self.requests[request.request_id]
            failed.append(request.make_output())
        return failed

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def get_num_unfinished_requests(self) -> int:
        return len(self.requests)

    def get_stats(self) -> EngineStats:
        """The current load, and counters since the engine started."""
        processor, lora = self.output_processor, self.config.lora_config
        return EngineStats.of(
            self.scheduler,
            processor.num_prompt_tokens,
            processor.num_generation_tokens,
            len(self.waiting_for_grammar),
            self.iteration_tokens,
            None if self.drafter is None else processor.spec_decoding,
            None if lora is None else LoRAStats.of(self.scheduler, lora.max_loras),
        )

    def get_stats_per_engine(self) -> list[EngineStats]:
        """[get_stats()]: one engine (DPEngine has one per replica)."""
        return [self.get_stats()]

    def is_healthy(self) -> bool:
        """False once the executor cannot run steps any more (a tensor-parallel worker died)."""
        return self.executor.is_healthy()

    def shutdown(self) -> None:
        """Stop tensor-parallel workers; the engine is unusable afterwards."""
        while self.batch_queue and self.executor.is_healthy():
            self._finish_oldest_batch()  # the stages' channels drain before they stop
        self.structured_output.shutdown()
        self.executor.shutdown()
